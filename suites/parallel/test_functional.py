"""Contract: functional collectives (torch.distributed._functional_collectives).

The collectives DTensor, FSDP2 and compiled code call: they return a new tensor
(an AsyncCollectiveTensor until waited on), leave their input alone, accept a
ProcessGroup, a list of ranks or a DeviceMesh as the group, and are
differentiable: the backward of all_reduce is all_reduce, of all_gather a
reduce_scatter, of reduce_scatter an all_gather, of all_to_all the reverse
all_to_all. Every expectation is the oracle's (backends/reference/semantics.py)
over inputs whose every sum is exact, so results must match bit for bit
(avg within 2 ulp).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from backends.reference import semantics
from fixtures.rank import ctx
from suites import collectives, values
from suites.checks import expect_on_every_rank, expect_tensor
from suites.parallel import common

pytestmark = pytest.mark.needs(form="functional")

SHAPE = (4, 3)
REDUCE_CASES = [pytest.param(dtype, op, id=f"{dtype}-{op}")
                for dtype, op in [("float32", "sum"), ("float32", "avg"), ("float32", "max"), ("float32", "min"),
                                  ("float32", "product"), ("float64", "sum"), ("int64", "sum"), ("bfloat16", "sum")]]


def split_size(sender: int, receiver: int, uneven: bool) -> int:
    return 1 + sender + 2 * receiver if uneven else 2


def _group(form: str):
    if form == "process_group":
        return dist.group.WORLD
    if form == "ranks":
        return list(range(ctx.world_size))
    return common.mesh((ctx.world_size,))


# ---------------------------------------------------------------- rank side
def funcol_all_reduce(op: str, dtype: str, group_form: str = "process_group"):
    x = values.rank_input(op, dtype, SHAPE, ctx.rank).to(ctx.device)
    before = x.clone()
    out = funcol.wait_tensor(funcol.all_reduce(x, op, _group(group_form)))
    return out.cpu(), torch.equal(x, before)


def funcol_all_gather(gather_dim: int):
    x = common.rank_tensor(ctx.rank, (2, 3)).to(ctx.device)
    return funcol.wait_tensor(common.all_gather(x, gather_dim, dist.group.WORLD)).cpu()


def _scatter_input(op: str, rank: int, world_size: int, scatter_dim: int) -> torch.Tensor:
    shape = (2 * world_size, 3) if scatter_dim == 0 else (2, 3 * world_size)
    return values.rank_input(op, "float32", shape, rank)


def funcol_reduce_scatter(op: str, scatter_dim: int):
    x = _scatter_input(op, ctx.rank, ctx.world_size, scatter_dim).to(ctx.device)
    return funcol.wait_tensor(common.reduce_scatter(x, op, scatter_dim, dist.group.WORLD)).cpu()


def _a2a_input(rank: int, world_size: int, uneven: bool) -> tuple[torch.Tensor, list[int]]:
    splits = [split_size(rank, j, uneven) for j in range(world_size)]
    return common.rank_tensor(rank, (sum(splits), 2)), splits


def funcol_all_to_all(uneven: bool):
    x, in_splits = _a2a_input(ctx.rank, ctx.world_size, uneven)
    out_splits = [split_size(i, ctx.rank, uneven) for i in range(ctx.world_size)]
    out = funcol.all_to_all_single(x.to(ctx.device), out_splits if uneven else None,
                                   in_splits if uneven else None, dist.group.WORLD)
    return funcol.wait_tensor(out).cpu()


def input_rows(entry: collectives.Collective, rank: int, world_size: int) -> list[int]:
    """Rows of each of rank ``rank``'s input chunks: uneven splits where the collective takes them, else 2."""
    uneven = "uneven" in entry.splits
    return [split_size(rank, j, uneven) for j in range(entry.inputs.count(world_size))]


def functional_args(entry: collectives.Collective, rank: int, world_size: int) -> collectives.FunctionalArgs:
    """SUM along dim 0 on the world; split sizes where the collective takes them."""
    args = collectives.FunctionalArgs(dist.group.WORLD)
    if entry.splits:
        args.input_splits = input_rows(entry, rank, world_size)
        args.output_splits = [input_rows(entry, i, world_size)[rank] for i in range(world_size)]
    return args


def functional_input(entry: collectives.Collective, rank: int, world_size: int, cols: tuple = (), salt: int = 0):
    return common.rank_tensor(rank, (sum(input_rows(entry, rank, world_size)),) + cols, salt)


def oracle_rows(entry: collectives.Collective, inputs: list, rank_rows: list) -> list:
    """The table's oracle (SUM) over every rank's input, cut into its chunks: per rank, its output chunks."""
    chunks = [list(t.split(rows)) for t, rows in zip(inputs, rank_rows)]
    return entry.oracle(chunks, "sum" if entry.reduces else None, None)


def funcol_in_flight():
    """Every functional collective issued before any is waited on, then waited in reverse order."""
    n, me = ctx.world_size, ctx.rank
    pending = []
    for salt, entry in enumerate(collectives.functional()):
        args = functional_args(entry, me, n)
        x = functional_input(entry, me, n, salt=salt).to(ctx.device)
        pending.append(entry.functional.call(entry.functional.function(), x, args))
    kinds = [type(t).__name__ for t in pending]
    return [funcol.wait_tensor(t).cpu() for t in pending[::-1]][::-1], kinds


def _weights(rank: int, shape) -> torch.Tensor:
    return common.rank_tensor(rank, tuple(shape), salt=3) / 8  # still exact: a power-of-two scale


def funcol_backward(collective: str):
    n, me, entry = ctx.world_size, ctx.rank, collectives.get(collective)
    x = functional_input(entry, me, n, (2,)).to(ctx.device).requires_grad_(True)
    out = funcol.wait_tensor(entry.functional.call(entry.functional.function(differentiable=True), x,
                                                   functional_args(entry, me, n)))
    (out * _weights(me, out.shape).to(ctx.device)).sum().backward()
    return x.grad.cpu()


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("dtype,op", REDUCE_CASES)
def test_funcol_all_reduce(world, dtype, op):
    """funcol.all_reduce returns the exact reduction on every rank and leaves its input untouched."""
    results = world.run(funcol_all_reduce, op, dtype)
    expected = semantics.all_reduce(values.rank_inputs(op, dtype, SHAPE, world.world_size), op)[0]
    expect_on_every_rank([r[0] for r in results], expected, f"funcol.all_reduce {op} {dtype}", exact=op != "avg")
    assert all(r[1] for r in results), "funcol.all_reduce modified its input (it is out-of-place)"


@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("group_form", ["process_group", "ranks", "device_mesh"])
def test_funcol_group_forms(world, group_form):
    """funcol.all_reduce takes its group as a ProcessGroup, a list of ranks or a DeviceMesh alike."""
    results = world.run(funcol_all_reduce, "sum", "float32", group_form)
    expected = values.reduced("sum", "float32", SHAPE, world.world_size)
    expect_on_every_rank([r[0] for r in results], expected, f"funcol.all_reduce with group as {group_form}")


@pytest.mark.needs(collective="all_gather")
@pytest.mark.parametrize("gather_dim", [0, 1])
def test_funcol_all_gather(world, gather_dim):
    """funcol.all_gather_single (all_gather_tensor) concatenates every rank's tensor in rank order along gather_dim."""
    results = world.run(funcol_all_gather, gather_dim)
    inputs = [common.rank_tensor(r, (2, 3)) for r in range(world.world_size)]
    expected = torch.cat(semantics.all_gather(inputs)[0], dim=gather_dim)
    expect_on_every_rank(results, expected, f"funcol all_gather along dim {gather_dim}")


@pytest.mark.needs(collective="reduce_scatter")
@pytest.mark.parametrize("scatter_dim", [0, 1])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_funcol_reduce_scatter(world, op, scatter_dim):
    """funcol.reduce_scatter_single (reduce_scatter_tensor) gives rank i the reduction of every rank's chunk i along scatter_dim."""
    results = world.run(funcol_reduce_scatter, op, scatter_dim)
    n = world.world_size
    chunks = [list(_scatter_input(op, r, n, scatter_dim).chunk(n, dim=scatter_dim)) for r in range(n)]
    for rank, (out, expected) in enumerate(zip(results, semantics.reduce_scatter(chunks, op))):
        expect_tensor(out, expected, f"funcol reduce_scatter {op} dim {scatter_dim} on rank {rank}",
                      exact=op != "avg")


@pytest.mark.needs(collective="all_to_all")
@pytest.mark.parametrize("split", ["even", "uneven"])
def test_funcol_all_to_all_single(world, split):
    """funcol.all_to_all_single sends split j of rank i to rank j at position i, even or uneven splits."""
    uneven = split == "uneven"
    results = world.run(funcol_all_to_all, uneven)
    n = world.world_size
    inputs = [_a2a_input(r, n, uneven) for r in range(n)]
    expected = semantics.all_to_all_single([t for t, _ in inputs], [s for _, s in inputs])
    for rank, out in enumerate(results):
        expect_tensor(out, expected[rank], f"funcol all_to_all_single ({split}) on rank {rank}")


@pytest.mark.needs(feature="async_work")
def test_funcol_wait_tensor_in_flight(world):
    """Collectives issued back to back complete independently: wait_tensor in reverse order gives each its own exact result."""
    results = world.run(funcol_in_flight)
    n = world.world_size
    expected = []
    for salt, entry in enumerate(collectives.functional()):
        rows = [input_rows(entry, r, n) for r in range(n)]
        outs = oracle_rows(entry, [functional_input(entry, r, n, salt=salt) for r in range(n)], rows)
        expected.append((entry.name, [torch.cat(chunks) for chunks in outs]))
    for rank, (outs, _) in enumerate(results):
        for (what, exp), out in zip(expected, outs):
            expect_tensor(out, exp[rank], f"{what} waited last-issued-first on rank {rank}")


def _expected_grads(collective: str, n: int) -> list[torch.Tensor]:
    """The adjoint collective (the table's ``functional.adjoint``) applied to every rank's output weights,
    cut as the forward's output chunks (via the oracle)."""
    entry = collectives.get(collective)
    adjoint = collectives.get(entry.functional.adjoint)
    rows = [input_rows(entry, r, n) for r in range(n)]
    forward = oracle_rows(entry, [functional_input(entry, r, n, (2,)) for r in range(n)], rows)
    weights = [list(_weights(r, (sum(c.shape[0] for c in chunks), 2)).split([c.shape[0] for c in chunks]))
               for r, chunks in enumerate(forward)]
    return [torch.cat(chunks) for chunks in adjoint.oracle(weights, "sum", None)]


@pytest.mark.needs(feature="autograd")
@pytest.mark.parametrize("collective", [pytest.param(c.name, id=c.bench_name) for c in collectives.functional()])
def test_funcol_backward(world, collective):
    """Autograd through a functional collective: every rank's input gradient is the adjoint collective of the output gradients."""
    results = world.run(funcol_backward, collective)
    for rank, (grad, expected) in enumerate(zip(results, _expected_grads(collective, world.world_size))):
        expect_tensor(grad, expected, f"gradient through funcol {collective} on rank {rank}")
