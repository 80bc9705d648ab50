"""Contract: all_reduce.

Every rank ends with the reduce op applied over all ranks' inputs, exactly,
for every meaningful (dtype, op) pair, every shape, contiguous or not, sync
or async.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import values
from suites.checks import expect_on_every_rank, expect_tensor

pytestmark = pytest.mark.needs(collective="all_reduce")

MATRIX = [
    pytest.param(dtype, op, id=f"{dtype}-{op}")
    for dtype in values.DTYPES
    for op in values.OPS_BY_KIND[values.kind_of(dtype)]
]
# Every (dtype, op) on every small shape; the 4 MiB shape on a few that take
# different code paths (chunked float sum, int64 compare, bfloat16, bool).
SHAPE_CASES = [
    pytest.param(dtype, op, shape, id=f"{dtype}-{op}-{shape}")
    for dtype in values.DTYPES
    for op in values.OPS_BY_KIND[values.kind_of(dtype)]
    for shape in ("scalar", "2d", "empty")
] + [
    pytest.param(dtype, op, "4MiB", id=f"{dtype}-{op}-4MiB")
    for dtype, op in (("float32", "sum"), ("int64", "max"), ("bfloat16", "sum"), ("bool", "bxor"))
]
SENTINEL = 77


# ---------------------------------------------------------------- rank side
def all_reduce_on_rank(op, dtype, shape_name, layout="contiguous", async_op=False):
    shape = values.SHAPES[shape_name]
    data = values.rank_input(op, dtype, shape, ctx.rank).to(ctx.device)
    if layout == "non_contiguous":
        # The view is every other column of a wider buffer; the other columns
        # hold a sentinel the collective must leave alone.
        buffer = torch.full(shape[:-1] + (2 * shape[-1],), SENTINEL, dtype=data.dtype, device=ctx.device)
        tensor = buffer[..., ::2]
        tensor.copy_(data)
        assert not tensor.is_contiguous()
    else:
        buffer = tensor = data
    work = dist.all_reduce(tensor, op=values.reduce_op(op), async_op=async_op)
    if async_op:
        work.wait()
    return tensor.cpu(), buffer.cpu()


def all_reduce_with_history(async_op):
    """all_reduce in place on a tensor with autograd history, under no_grad (as in an autograd.Function's forward)."""
    x = torch.full((3, 2), float(ctx.rank + 1), device=ctx.device, requires_grad=True)
    y = x * 2
    node = y.grad_fn
    with torch.no_grad():
        work = dist.all_reduce(y, async_op=async_op)
    if async_op:
        work.wait()
    history = (type(y.grad_fn).__name__, y.grad_fn is node)
    y.sum().backward()  # through the history y had before the call
    return y.detach().cpu(), history, x.grad.cpu()


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("dtype,op", MATRIX)
def test_all_reduce(world, dtype, op):
    """all_reduce gives every rank the exact reduction of all ranks' inputs."""
    results = world.run(all_reduce_on_rank, op, dtype, "1d")
    expected = values.reduced(op, dtype, values.SHAPES["1d"], world.world_size)
    expect_on_every_rank([r[0] for r in results], expected, f"all_reduce {op} {dtype}", exact=op != "avg")


@pytest.mark.parametrize("dtype,op,shape", SHAPE_CASES)
def test_all_reduce_shapes(world, dtype, op, shape):
    """all_reduce handles scalars, 1-D, 2-D, empty and 4 MiB tensors."""
    results = world.run(all_reduce_on_rank, op, dtype, shape)
    expected = values.reduced(op, dtype, values.SHAPES[shape], world.world_size)
    expect_on_every_rank([r[0] for r in results], expected, f"all_reduce {op} {dtype} shape {shape}",
                         exact=op != "avg")


@pytest.mark.parametrize("layout", ["non_contiguous"])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("int64", "bxor")])
def test_all_reduce_non_contiguous_view(world, dtype, op, layout):
    """all_reduce of a strided view reduces the view's elements and leaves the rest of the buffer untouched."""
    results = world.run(all_reduce_on_rank, op, dtype, "2d", layout)
    expected = values.reduced(op, dtype, values.SHAPES["2d"], world.world_size)
    for rank, (view, buffer) in enumerate(results):
        expect_tensor(view, expected, f"all_reduce {op} of a strided view on rank {rank}")
        untouched = buffer[..., 1::2]
        expect_tensor(untouched, torch.full_like(untouched, SENTINEL),
                      f"buffer elements outside the view on rank {rank}")


@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"), ("int32", "product"),
                                      ("uint8", "bor"), ("bool", "band")])
def test_all_reduce_async(world, dtype, op):
    """all_reduce(async_op=True) returns a Work; after wait() the result is complete and exact."""
    results = world.run(all_reduce_on_rank, op, dtype, "4MiB" if dtype == "float32" else "2d", "contiguous", True)
    shape = values.SHAPES["4MiB" if dtype == "float32" else "2d"]
    expected = values.reduced(op, dtype, shape, world.world_size)
    expect_on_every_rank([r[0] for r in results], expected, f"async all_reduce {op} {dtype}")


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_all_reduce_leaves_autograd_history_alone(world, async_op):
    """all_reduce writes data only: a tensor with autograd history keeps its grad_fn and its gradient.

    Model-parallel layers all_reduce activations in place inside an autograd.Function's
    forward, and functional collectives attach their backward node to the output before the
    result lands. A backend that writes the result with autograd recording (a worker thread's
    copy_, grad mode being per thread) rebases the tensor onto a CopyBackwards node: the
    gradient through everything before the collective becomes zero.
    """
    results = world.run(all_reduce_with_history, async_op)
    n = world.world_size
    for rank, (value, history, grad) in enumerate(results):
        expect_tensor(value, torch.full((3, 2), float(n * (n + 1))), f"all_reduce of a tensor with history on rank {rank}")
        assert history == ("MulBackward0", True), \
            f"rank {rank}: all_reduce replaced the tensor's grad_fn MulBackward0 by {history[0]} (autograd recorded the write)"
        expect_tensor(grad, torch.full((3, 2), 2.0), f"gradient through the history before all_reduce on rank {rank}")
