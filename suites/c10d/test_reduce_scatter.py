"""Contract: reduce_scatter gives rank i the reduction of everybody's chunk i.

Both forms: a list of per-destination tensors, and one flat input tensor
split into world_size equal chunks.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import compat, values
from suites.checks import expect_tensor

pytestmark = pytest.mark.needs(collective="reduce_scatter")

CHUNK = (5,)
CASES = [
    pytest.param(dtype, op, id=f"{dtype}-{op}")
    for dtype, op in [("float32", "sum"), ("float64", "sum"), ("float32", "max"), ("float32", "min"),
                      ("float32", "product"), ("float32", "avg"), ("int64", "sum"), ("int32", "min"),
                      ("bfloat16", "sum")]
]


def _chunk_input(op, dtype, rank, dest):
    # chunk for `dest` from `rank`: the standard reduce input, shifted so chunks differ
    base = values.rank_input(op, dtype, CHUNK, rank)
    if op in ("sum", "avg", "min", "max") and dtype != "bool":
        base = base + dest
    return base


def expected_chunk(op, dtype, world_size, dest):
    return values.reduce_tensors(op, [_chunk_input(op, dtype, r, dest) for r in range(world_size)])


# ---------------------------------------------------------------- rank side
def reduce_scatter_list(op, dtype, async_op=False):
    inputs = [_chunk_input(op, dtype, ctx.rank, dest).to(ctx.device) for dest in range(ctx.world_size)]
    out = torch.zeros(CHUNK, dtype=values.DTYPES[dtype], device=ctx.device)
    work = dist.reduce_scatter(out, inputs, op=values.reduce_op(op), async_op=async_op)
    if async_op:
        work.wait()
    return out.cpu()


def reduce_scatter_tensor(op, dtype, async_op=False):
    flat = torch.cat([_chunk_input(op, dtype, ctx.rank, dest) for dest in range(ctx.world_size)]).to(ctx.device)
    out = torch.zeros(CHUNK, dtype=values.DTYPES[dtype], device=ctx.device)
    work = compat.reduce_scatter_single(out, flat, op=values.reduce_op(op), async_op=async_op)
    if async_op:
        work.wait()
    return out.cpu()


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_scatter_list(world, dtype, op):
    """reduce_scatter (list form): rank i ends with op over every rank's list entry i."""
    results = world.run(reduce_scatter_list, op, dtype)
    for rank, out in enumerate(results):
        expect_tensor(out, expected_chunk(op, dtype, world.world_size, rank),
                      f"reduce_scatter {op} {dtype} on rank {rank}", exact=op != "avg")


@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_scatter_tensor(world, dtype, op):
    """reduce_scatter (tensor form): rank i ends with op over every rank's i-th chunk."""
    results = world.run(reduce_scatter_tensor, op, dtype)
    for rank, out in enumerate(results):
        expect_tensor(out, expected_chunk(op, dtype, world.world_size, rank),
                      f"reduce_scatter_tensor {op} {dtype} on rank {rank}", exact=op != "avg")


@pytest.mark.parametrize("form", ["list", "tensor"])
def test_reduce_scatter_async(world, form):
    """reduce_scatter(async_op=True): after wait() each rank holds its reduced chunk."""
    fn = reduce_scatter_list if form == "list" else reduce_scatter_tensor
    results = world.run(fn, "sum", "float32", True)
    for rank, out in enumerate(results):
        expect_tensor(out, expected_chunk("sum", "float32", world.world_size, rank),
                      f"async reduce_scatter ({form}) on rank {rank}")
