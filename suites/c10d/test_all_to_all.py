"""Contract: all_to_all sends chunk j of rank i to rank j, placed at position i.

Both forms (list of tensors, and one flat tensor with optional split sizes),
with even and uneven splits. With uneven splits rank i sends (1 + i + 2j)
elements to rank j, so every (sender, receiver) pair has its own size and the
sizes are not symmetric.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import values
from suites.checks import expect_tensor

pytestmark = pytest.mark.needs(collective="all_to_all")


def split_size(sender, receiver, uneven):
    # asymmetric on purpose: what s sends to r differs from what r sends to s, so a
    # backend that lays out received chunks by its own send sizes is caught
    return 1 + sender + 2 * receiver if uneven else 3


def chunk(sender, receiver, uneven, dtype="float32"):
    """What ``sender`` sends to ``receiver``: it names both (sender*1000 + receiver*100 + k)."""
    n = split_size(sender, receiver, uneven)
    return (torch.arange(n, dtype=torch.int64) + sender * 1000 + receiver * 100).to(values.DTYPES[dtype])


# ---------------------------------------------------------------- rank side
def all_to_all_list(uneven, dtype, async_op=False):
    n, me = ctx.world_size, ctx.rank
    inputs = [chunk(me, j, uneven, dtype).to(ctx.device) for j in range(n)]
    outputs = [torch.full((split_size(i, me, uneven),), -1, dtype=values.DTYPES[dtype], device=ctx.device)
               for i in range(n)]
    work = dist.all_to_all(outputs, inputs, async_op=async_op)
    if async_op:
        work.wait()
    return [t.cpu() for t in outputs]


def all_to_all_single(uneven, dtype, async_op=False):
    n, me = ctx.world_size, ctx.rank
    send = torch.cat([chunk(me, j, uneven, dtype) for j in range(n)]).to(ctx.device)
    in_splits = [split_size(me, j, uneven) for j in range(n)]
    out_splits = [split_size(i, me, uneven) for i in range(n)]
    out = torch.full((sum(out_splits),), -1, dtype=values.DTYPES[dtype], device=ctx.device)
    work = dist.all_to_all_single(out, send, output_split_sizes=out_splits if uneven else None,
                                  input_split_sizes=in_splits if uneven else None, async_op=async_op)
    if async_op:
        work.wait()
    return out.cpu()


# ------------------------------------------------------------------ clauses
def _expected_list(rank, world_size, uneven, dtype):
    return [chunk(i, rank, uneven, dtype) for i in range(world_size)]


@pytest.mark.needs(form="list")
@pytest.mark.parametrize("split", ["even", "uneven"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_all_to_all_list(world, dtype, split):
    """all_to_all (list form): output i on rank j is input j of rank i."""
    uneven = split == "uneven"
    results = world.run(all_to_all_list, uneven, dtype)
    for rank, outputs in enumerate(results):
        for source, expected in enumerate(_expected_list(rank, world.world_size, uneven, dtype)):
            expect_tensor(outputs[source], expected, f"all_to_all output {source} on rank {rank}")


@pytest.mark.needs(form="single")
@pytest.mark.parametrize("split", ["even", "uneven"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_all_to_all_single(world, dtype, split):
    """all_to_all_single: rank j's output is, in rank order, the j-th split of every rank's input."""
    uneven = split == "uneven"
    results = world.run(all_to_all_single, uneven, dtype)
    for rank, out in enumerate(results):
        expected = torch.cat(_expected_list(rank, world.world_size, uneven, dtype))
        expect_tensor(out, expected, f"all_to_all_single ({'uneven' if uneven else 'even'}) on rank {rank}")


@pytest.mark.needs(split="uneven")
@pytest.mark.parametrize("form", ["list", "single"])
def test_all_to_all_async(world, form):
    """all_to_all(async_op=True): after wait() every chunk is in place (uneven splits)."""
    fn = all_to_all_list if form == "list" else all_to_all_single
    results = world.run(fn, True, "float32", True)
    for rank, out in enumerate(results):
        expected = _expected_list(rank, world.world_size, True, "float32")
        if form == "single":
            expect_tensor(out, torch.cat(expected), f"async all_to_all_single on rank {rank}")
        else:
            for source, exp in enumerate(expected):
                expect_tensor(out[source], exp, f"async all_to_all output {source} on rank {rank}")
