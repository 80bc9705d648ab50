"""Contract: DeviceMesh and DTensor over the backend.

A 1-D mesh over the world and, where the world splits in two (world size 4:
2 x 2), a 2-D mesh: each mesh dimension's group holds exactly the ranks that
share the other coordinates. ``redistribute`` along each mesh dimension
(Shard(0) -> Replicate, Partial -> Replicate, Partial -> Shard(0),
Shard(0) -> Shard(1), and an uneven Shard -> Replicate) leaves every rank with
its exact piece of the full tensor, and a sharded matmul (column-wise,
row-wise) equals the local one. DTensors are built with ``from_local`` so the
only communication is the redistribution under test; values are small
integers and binary fractions, so results are exact.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from backends.reference import semantics
from fixtures.rank import ctx
from suites.checks import expect_tensor
from suites.parallel import common

pytestmark = pytest.mark.needs(form="dtensor")

# (mesh id, mesh dim) pairs: every dimension of every mesh
MESH_DIMS = [pytest.param("1d", 0, id="1d-dim0"), pytest.param("2d", 0, id="2d-dim0"),
             pytest.param("2d", 1, id="2d-dim1")]
# Each transition with the collective DTensor issues for it on this device type. On CPU,
# Shard(0) -> Shard(1) is an all_gather and a local chunk, not an all_to_all (torch 2.13's
# shard_dim_alltoall: "CPU process group does not support alltoall yet, falling back with
# allgather + chunk").
TRANSITIONS = [pytest.param(name, id=name, marks=pytest.mark.needs(collective=collective))
               for name, collective in [("shard_to_replicate", "all_gather"), ("partial_to_replicate", "all_reduce"),
                                        ("partial_to_shard", "reduce_scatter"), ("shard0_to_shard1", "all_gather"),
                                        ("uneven_shard_to_replicate", "all_gather")]]
# (mesh, style) with the collectives its full_tensor() needs: a column-sharded output is
# all-gathered, a partial one all-reduced; on the 2-D mesh rows are also gathered over dim 0.
MATMULS = [pytest.param(kind, style, id=f"{kind}-{style}", marks=pytest.mark.needs(collective=collective))
           for kind, style, collective in [("1d", "colwise", "all_gather"), ("1d", "rowwise", "all_reduce"),
                                           ("2d", "colwise", "all_gather"), ("2d", "rowwise", "all_gather")]]
SHAPE, UNEVEN_SHAPE = (8, 12), (7, 10)
# Partial contributions: weights summing to 1, binary fractions (exact), different per coordinate
PARTIAL_WEIGHTS = {1: (1.0,), 2: (0.25, 0.75), 3: (0.25, 0.25, 0.5), 4: (0.125, 0.125, 0.25, 0.5)}


def mesh_shape(kind: str, world_size: int) -> tuple[int, ...]:
    if kind == "1d":
        return (world_size,)
    if world_size < 4 or world_size % 2:
        pytest.skip(f"a 2-D mesh (2 x n/2) needs an even world size >= 4, this world has {world_size}")
    return (2, world_size // 2)


def mesh_layout(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(int(torch.tensor(shape).prod())).reshape(shape)


def coordinate(rank: int, shape: tuple[int, ...]) -> list[int]:
    return [int(c) for c in (mesh_layout(shape) == rank).nonzero()[0]]


def piece(full: torch.Tensor, placement: str, size: int, coord: int) -> torch.Tensor:
    """What a rank at ``coord`` (of ``size``) holds of ``full`` under a placement."""
    if placement == "replicate":
        return full
    dim = 0 if placement == "shard0" else 1
    chunks = list(full.chunk(size, dim=dim))  # DTensor's split: torch.chunk, empty chunks at the end
    return chunks[coord] if coord < len(chunks) else full.narrow(dim, 0, 0)


# ---------------------------------------------------------------- rank side
def _placements(shape, mesh_dim, placement):
    out = [Replicate() for _ in shape]
    out[mesh_dim] = placement
    return out


def redistribute(shape: tuple[int, ...], mesh_dim: int, transition: str):
    mesh = common.mesh(shape)
    coord = mesh.get_coordinate()[mesh_dim]
    size = shape[mesh_dim]
    full = common.full_tensor(UNEVEN_SHAPE if transition.startswith("uneven") else SHAPE)
    source, target = {"shard_to_replicate": (Shard(0), Replicate()), "uneven_shard_to_replicate": (Shard(0), Replicate()),
                      "partial_to_replicate": (Partial(), Replicate()), "partial_to_shard": (Partial(), Shard(0)),
                      "shard0_to_shard1": (Shard(0), Shard(1))}[transition]
    if isinstance(source, Partial):
        local = full * PARTIAL_WEIGHTS[size][coord]
    else:
        local = piece(full, "shard0", size, coord)
    dt = DTensor.from_local(local.to(ctx.device), mesh, _placements(shape, mesh_dim, source), run_check=False,
                            shape=full.shape, stride=full.stride())
    out = dt.redistribute(mesh, _placements(shape, mesh_dim, target))
    return out.to_local().cpu(), out.full_tensor().cpu()


def sharded_matmul(shape: tuple[int, ...], style: str):
    """(6 x 8) @ (8 x 12); on a 2-D mesh rows of A are also split over dim 0 (data parallel)."""
    mesh = common.mesh(shape)
    a, b = _matmul_operands()
    tp = len(shape) - 1
    a_place, b_place = [Replicate()] * len(shape), [Replicate()] * len(shape)
    if len(shape) == 2:
        a_place[0] = Shard(0)
    if style == "colwise":  # B split by columns: the output is column-sharded
        b_place[tp] = Shard(1)
    else:  # A by columns, B by rows: each rank holds a partial sum of the output
        a_place[tp], b_place[tp] = Shard(1), Shard(0)
    da = _from_full(a, mesh, a_place)
    db = _from_full(b, mesh, b_place)
    out = torch.matmul(da, db)
    return out.full_tensor().cpu(), [str(p) for p in out.placements]


def _from_full(full, mesh, placements):
    local = full
    for dim, p in enumerate(placements):
        if isinstance(p, Shard):
            local = local.chunk(mesh.size(dim), dim=p.dim)[mesh.get_local_rank(dim)]
    return DTensor.from_local(local.to(ctx.device), mesh, placements, run_check=False,
                              shape=full.shape, stride=full.stride())


def _matmul_operands():
    a = (torch.arange(48, dtype=torch.float32).reshape(6, 8) % 7) - 3
    b = (torch.arange(96, dtype=torch.float32).reshape(8, 12) % 5) - 2
    return a, b


def mesh_dim_reduce(shape: tuple[int, ...]):
    mesh = common.mesh(shape)
    x = common.rank_tensor(ctx.rank, (3,)).to(ctx.device)
    per_dim = []
    for dim in range(len(shape)):
        group = mesh.get_group(dim)
        outs = [funcol.wait_tensor(funcol.all_reduce(x, op, (mesh, dim))).cpu() for op in ("sum", "avg")]
        per_dim.append((outs, group.size(), mesh.get_local_rank(dim)))
    return mesh.get_coordinate(), per_dim


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_device_mesh_dims(world, kind):
    """Each mesh dimension's group holds exactly the ranks sharing the other coordinates; all_reduce over it sums and averages them."""
    shape = mesh_shape(kind, world.world_size)
    layout = mesh_layout(shape)
    for rank, (coord, per_dim) in enumerate(world.run(mesh_dim_reduce, shape)):
        assert list(coord) == coordinate(rank, shape), f"rank {rank}: mesh coordinate {coord}"
        for dim, (outs, size, local_rank) in enumerate(per_dim):
            index = list(coordinate(rank, shape))
            index[dim] = slice(None)
            peers = [int(r) for r in layout[tuple(index)].reshape(-1)]
            assert (size, local_rank) == (len(peers), peers.index(rank)), \
                f"rank {rank}: mesh dim {dim} group size/local rank {(size, local_rank)}, expected {(len(peers), peers.index(rank))}"
            for op, out in zip(("sum", "avg"), outs):
                expected = semantics.all_reduce([common.rank_tensor(p, (3,)) for p in peers], op)[0]
                expect_tensor(out, expected, f"all_reduce {op} over mesh dim {dim} (ranks {peers}) on rank {rank}",
                              exact=op == "sum")


@pytest.mark.parametrize("transition", TRANSITIONS)
@pytest.mark.parametrize("kind,mesh_dim", MESH_DIMS)
def test_redistribute(world, kind, mesh_dim, transition):
    """DTensor.redistribute along a mesh dimension leaves every rank its exact piece; full_tensor() is the full tensor."""
    shape = mesh_shape(kind, world.world_size)
    full = common.full_tensor(UNEVEN_SHAPE if transition.startswith("uneven") else SHAPE)
    target = {"shard0_to_shard1": "shard1", "partial_to_shard": "shard0"}.get(transition, "replicate")
    for rank, (local, gathered) in enumerate(world.run(redistribute, shape, mesh_dim, transition)):
        coord = coordinate(rank, shape)[mesh_dim]
        expect_tensor(local, piece(full, target, shape[mesh_dim], coord),
                      f"{transition} on {kind} mesh dim {mesh_dim}: local tensor of rank {rank}")
        expect_tensor(gathered, full, f"{transition} on {kind} mesh dim {mesh_dim}: full_tensor() on rank {rank}")


@pytest.mark.parametrize("kind,style", MATMULS)
def test_sharded_matmul(world, kind, style):
    """A matmul of sharded DTensors (column-wise, or row-wise with a partial sum) equals the local matmul."""
    shape = mesh_shape(kind, world.world_size)
    a, b = _matmul_operands()
    for rank, (out, placements) in enumerate(world.run(sharded_matmul, shape, style)):
        expect_tensor(out, a @ b, f"{style} sharded matmul on {kind} mesh (output {placements}) on rank {rank}")
