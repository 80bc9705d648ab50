"""Contract: collectives read from and write into strided (non-contiguous) views.

Every tensor here is every other column of a wider buffer whose remaining
columns hold a sentinel. A backend must read the view's elements (not the
first numel() elements of the storage), write its result into the view, and
leave the sentinel columns alone. (all_reduce's clause lives with all_reduce.)
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import values
from suites.checks import expect_tensor

pytestmark = pytest.mark.parametrize("layout", ["non_contiguous"])

SHAPE = (3, 4)
SENTINEL = -5


def strided_view(data):
    """A view of ``data``'s values with stride 2 in its last dimension, plus its buffer."""
    buffer = torch.full(data.shape[:-1] + (2 * data.shape[-1],), SENTINEL, dtype=data.dtype, device=ctx.device)
    view = buffer[..., ::2]
    view.copy_(data)
    assert not view.is_contiguous()
    return view, buffer


def payload(rank, salt=0):
    return values.rank_payload(rank, SHAPE[0] * SHAPE[1], "float32", salt).reshape(SHAPE)


# ---------------------------------------------------------------- rank side
def all_gather_into_views():
    mine, _ = strided_view(payload(ctx.rank))
    pairs = [strided_view(torch.zeros(SHAPE)) for _ in range(ctx.world_size)]
    dist.all_gather([view for view, _ in pairs], mine)
    return [(view.cpu(), buffer.cpu()) for view, buffer in pairs]


def broadcast_views():
    out = {}
    for root in range(ctx.world_size):
        view, buffer = strided_view(payload(ctx.rank))
        dist.broadcast(view, src=root)
        out[root] = (view.cpu(), buffer.cpu())
    return out


def scatter_into_views():
    out = {}
    for root in range(ctx.world_size):
        chunks = [strided_view(payload(dest, salt=root))[0] for dest in range(ctx.world_size)] \
            if ctx.rank == root else None
        view, buffer = strided_view(torch.zeros(SHAPE))
        dist.scatter(view, scatter_list=chunks, src=root)
        out[root] = (view.cpu(), buffer.cpu())
    return out


def reduce_scatter_into_view():
    inputs = [strided_view(payload(ctx.rank, salt=dest))[0] for dest in range(ctx.world_size)]
    view, buffer = strided_view(torch.zeros(SHAPE))
    dist.reduce_scatter(view, inputs)
    return view.cpu(), buffer.cpu()


def expect_view(view, buffer, expected, what):
    expect_tensor(view, expected, what)
    rest = buffer[..., 1::2]
    expect_tensor(rest, torch.full_like(rest, SENTINEL), f"{what}: buffer outside the view")


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("collective", ["all_gather"])
def test_all_gather_strided_views(world, collective, layout):
    """all_gather reads a strided input and fills a list of strided output views, nothing else."""
    for rank, pairs in enumerate(world.run(all_gather_into_views)):
        for source, (view, buffer) in enumerate(pairs):
            expect_view(view, buffer, payload(source), f"all_gather entry {source} on rank {rank}")


@pytest.mark.parametrize("collective", ["broadcast"])
def test_broadcast_strided_view(world, collective, layout):
    """broadcast of a strided view delivers the root's view elements into every rank's view."""
    for rank, out in enumerate(world.run(broadcast_views)):
        for root, (view, buffer) in out.items():
            expect_view(view, buffer, payload(root), f"broadcast from {root} on rank {rank}")


@pytest.mark.parametrize("collective", ["scatter"])
def test_scatter_strided_views(world, collective, layout):
    """scatter reads strided chunks at the root and writes each into the receiver's strided view."""
    for rank, out in enumerate(world.run(scatter_into_views)):
        for root, (view, buffer) in out.items():
            expect_view(view, buffer, payload(rank, salt=root), f"scatter from {root} on rank {rank}")


@pytest.mark.parametrize("collective", ["reduce_scatter"])
def test_reduce_scatter_strided_views(world, collective, layout):
    """reduce_scatter reads strided inputs and writes the reduced chunk into a strided view."""
    for rank, (view, buffer) in enumerate(world.run(reduce_scatter_into_view)):
        expected = sum(payload(r, salt=rank) for r in range(world.world_size))
        expect_view(view, buffer, expected, f"reduce_scatter on rank {rank}")
