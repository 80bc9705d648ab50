"""Contract: broadcast and reduce, from and to every root.

broadcast: after the call every rank holds the root's tensor.
reduce: the root holds the reduction over all ranks; the others' inputs are
not required to survive (c10d leaves them unspecified), so only the root is
checked.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import values
from suites.checks import expect_tensor

BROADCAST_DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "bool"]
REDUCE_CASES = [
    pytest.param(dtype, op, id=f"{dtype}-{op}")
    for dtype, op in [("float32", "sum"), ("float64", "product"), ("float32", "min"), ("float32", "max"),
                      ("float32", "avg"), ("int64", "sum"), ("int32", "max"), ("uint8", "band"),
                      ("int64", "bxor"), ("bool", "bor")]
]


def _payload(dtype, rank, numel=9):
    if dtype == "bool":
        return (torch.arange(numel) + rank) % 3 == 0
    tensor = values.rank_payload(rank, numel, "int64")
    if dtype == "int64":
        tensor = tensor + 2**41  # beyond float precision: a lossy path shows
    if dtype in ("uint8",):
        tensor = tensor % 251
    if dtype in ("float16", "bfloat16"):
        tensor = tensor % 200  # exactly representable
    return tensor.to(values.DTYPES[dtype])


# ---------------------------------------------------------------- rank side
def broadcast_from_every_root(dtype, async_op=False):
    received = []
    for root in range(ctx.world_size):
        tensor = _payload(dtype, ctx.rank).to(ctx.device)
        work = dist.broadcast(tensor, src=root, async_op=async_op)
        if async_op:
            work.wait()
        received.append(tensor.cpu())
    return received


def reduce_to_every_root(op, dtype, async_op=False):
    at_root = {}
    for root in range(ctx.world_size):
        tensor = values.rank_input(op, dtype, (2, 3), ctx.rank).to(ctx.device)
        work = dist.reduce(tensor, dst=root, op=values.reduce_op(op), async_op=async_op)
        if async_op:
            work.wait()
        if ctx.rank == root:
            at_root[root] = tensor.cpu()
    return at_root


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(collective="broadcast")
@pytest.mark.parametrize("dtype", BROADCAST_DTYPES)
def test_broadcast_from_every_root(world, dtype):
    """broadcast(src=root) leaves every rank with the root's tensor, for every root."""
    results = world.run(broadcast_from_every_root, dtype)
    for root in range(world.world_size):
        expected = _payload(dtype, root)
        for rank, received in enumerate(results):
            expect_tensor(received[root], expected, f"broadcast from root {root}, {dtype}, on rank {rank}")


@pytest.mark.needs(collective="broadcast")
def test_broadcast_async(world):
    """broadcast(async_op=True): after wait() every rank holds the root's tensor."""
    results = world.run(broadcast_from_every_root, "float32", True)
    for root in range(world.world_size):
        for rank, received in enumerate(results):
            expect_tensor(received[root], _payload("float32", root), f"async broadcast from {root} on rank {rank}")


@pytest.mark.needs(collective="reduce")
@pytest.mark.parametrize("dtype,op", REDUCE_CASES)
def test_reduce_to_every_root(world, dtype, op):
    """reduce(dst=root) leaves the exact reduction over all ranks at the root, for every root."""
    results = world.run(reduce_to_every_root, op, dtype)
    expected = values.reduced(op, dtype, (2, 3), world.world_size)
    for root in range(world.world_size):
        expect_tensor(results[root][root], expected, f"reduce {op} {dtype} at root {root}", exact=op != "avg")


@pytest.mark.needs(collective="reduce")
def test_reduce_async(world):
    """reduce(async_op=True): after wait() the root holds the reduction."""
    results = world.run(reduce_to_every_root, "sum", "float64", True)
    expected = values.reduced("sum", "float64", (2, 3), world.world_size)
    for root in range(world.world_size):
        expect_tensor(results[root][root], expected, f"async reduce sum at root {root}")
