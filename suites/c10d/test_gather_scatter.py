"""Contract: all_gather, gather and scatter move whole tensors to the right place.

Every payload says which rank made it (element k of rank r is r*1000 + k), so
a wrong order, a wrong root or a lost chunk shows as a wrong value at a named
position.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import compat, values
from suites.checks import expect_tensor

NUMEL = 6
DTYPES = ["float32", "int64", "float16"]


def _payload(rank, dtype="float32", numel=NUMEL):
    tensor = values.rank_payload(rank, numel, "int64")
    if dtype == "float16":
        tensor = tensor % 1024  # exactly representable in float16
    return tensor.to(values.DTYPES[dtype])


# ---------------------------------------------------------------- rank side
def all_gather_list(dtype, async_op=False):
    mine = _payload(ctx.rank, dtype).to(ctx.device)
    out = [torch.full_like(mine, -1) for _ in range(ctx.world_size)]
    work = dist.all_gather(out, mine, async_op=async_op)
    if async_op:
        work.wait()
    return [t.cpu() for t in out]


def all_gather_into_tensor(dtype, async_op=False):
    mine = _payload(ctx.rank, dtype).to(ctx.device)
    out = torch.full((ctx.world_size * NUMEL,), -1, dtype=mine.dtype, device=ctx.device)
    work = compat.all_gather_single(out, mine, async_op=async_op)
    if async_op:
        work.wait()
    return out.cpu()


def gather_to_every_root(dtype):
    at_root = {}
    for root in range(ctx.world_size):
        mine = _payload(ctx.rank, dtype).to(ctx.device)
        out = [torch.full_like(mine, -1) for _ in range(ctx.world_size)] if ctx.rank == root else None
        dist.gather(mine, gather_list=out, dst=root)
        if ctx.rank == root:
            at_root[root] = [t.cpu() for t in out]
    return at_root


def scatter_from_every_root(dtype, async_op=False):
    received = {}
    for root in range(ctx.world_size):
        # the root's list: chunk i is destined for rank i, and says so (salt = root)
        chunks = [_payload(dest, dtype).add(root * 100).to(ctx.device) for dest in range(ctx.world_size)] \
            if ctx.rank == root else None
        out = torch.full((NUMEL,), -1, dtype=values.DTYPES[dtype], device=ctx.device)
        work = dist.scatter(out, scatter_list=chunks, src=root, async_op=async_op)
        if async_op:
            work.wait()
        received[root] = out.cpu()
    return received


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(collective="all_gather")
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_list(world, dtype):
    """all_gather into a list: entry i on every rank is rank i's tensor."""
    results = world.run(all_gather_list, dtype)
    for rank, out in enumerate(results):
        assert len(out) == world.world_size
        for source in range(world.world_size):
            expect_tensor(out[source], _payload(source, dtype), f"all_gather entry {source} on rank {rank}")


@pytest.mark.needs(collective="all_gather")
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_into_tensor(world, dtype):
    """all_gather into one tensor: chunk i (in rank order) is rank i's tensor."""
    results = world.run(all_gather_into_tensor, dtype)
    expected = torch.cat([_payload(r, dtype) for r in range(world.world_size)])
    for rank, out in enumerate(results):
        expect_tensor(out, expected, f"all_gather_into_tensor on rank {rank}")


@pytest.mark.needs(collective="all_gather")
@pytest.mark.parametrize("variant", ["list", "into_tensor"])
def test_all_gather_async(world, variant):
    """all_gather(async_op=True): after wait() every chunk is in place."""
    fn = all_gather_list if variant == "list" else all_gather_into_tensor
    results = world.run(fn, "float32", True)
    expected = [_payload(r) for r in range(world.world_size)]
    for rank, out in enumerate(results):
        got = out if variant == "list" else list(out.chunk(world.world_size))
        for source in range(world.world_size):
            expect_tensor(got[source], expected[source], f"async all_gather ({variant}) chunk {source} on rank {rank}")


@pytest.mark.needs(collective="gather")
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_gather_to_every_root(world, dtype):
    """gather(dst=root): entry i of the root's list is rank i's tensor, for every root."""
    results = world.run(gather_to_every_root, dtype)
    for root in range(world.world_size):
        gathered = results[root][root]
        for source in range(world.world_size):
            expect_tensor(gathered[source], _payload(source, dtype), f"gather at root {root}, entry {source}")


@pytest.mark.needs(collective="scatter")
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_scatter_from_every_root(world, dtype):
    """scatter(src=root): rank i receives entry i of the root's list, for every root."""
    results = world.run(scatter_from_every_root, dtype)
    for root in range(world.world_size):
        for rank, received in enumerate(results):
            expected = _payload(rank, dtype).add(root * 100)
            expect_tensor(received[root], expected, f"scatter from root {root} to rank {rank}")


@pytest.mark.needs(collective="scatter")
def test_scatter_async(world):
    """scatter(async_op=True): after wait() each rank holds its own entry."""
    results = world.run(scatter_from_every_root, "float32", True)
    for root in range(world.world_size):
        for rank, received in enumerate(results):
            expect_tensor(received[root], _payload(rank).add(root * 100), f"async scatter from {root} to {rank}")
