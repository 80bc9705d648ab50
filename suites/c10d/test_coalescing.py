"""Contract: coalesced collectives.

Several collectives issued as one (``_coalescing_manager`` around all_reduce,
all_gather_into_tensor or reduce_scatter_tensor calls, synchronously or with
``async_ops=True``; ``all_reduce_coalesced`` and ``all_gather_coalesced``; isend/irecv between the group's
start and end coalescing, as torch's batch_isend_irecv issues them for a backend advertising it)
leave every tensor exactly as if each collective had run on its own: the
right reduction in the right tensor, nothing swapped, dropped or reduced
twice. Tensors of one call have different sizes, so an implementation that
flattens them into one buffer and splits it back wrong shows. An async
coalesced call is complete after its Work (or future) is waited on.
PyTorch's own suite calls this capability ``supports_coalescing``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from backends.reference import semantics
from fixtures.rank import ctx
from suites import collectives, values
from suites.checks import expect_tensor
from suites.p2p.common import decoy, payload, sent

pytestmark = pytest.mark.needs(feature="coalescing")

SHAPES = ((5,), (2, 3), (1,), (4,))  # different sizes: the seams between tensors matter
P2P_SALT = 700  # the coalesced ring's messages (suites/p2p/common.py payloads)


def inputs_of(rank: int, op: str, dtype: str) -> list[torch.Tensor]:
    """Rank ``rank``'s tensors: one per shape, each exact under ``op`` (suites/values.py)."""
    return [values.rank_input(op, dtype, shape, rank) + i * (dtype != "bool")
            for i, shape in enumerate(SHAPES)]


def stacked(rank: int, index: int, world_size: int) -> torch.Tensor:
    """Input ``index`` of all_gather_into_tensor / reduce_scatter_tensor: dim 0 divisible by the world size."""
    return values.rank_payload(rank, world_size * (index + 2), "float32", salt=100 * index)


# ---------------------------------------------------------------- rank side
def manager_all_reduce(op: str, dtype: str, async_ops: bool):
    tensors = [t.to(ctx.device) for t in inputs_of(ctx.rank, op, dtype)]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for tensor in tensors:
            dist.all_reduce(tensor, op=values.reduce_op(op))
    if async_ops:
        cm.wait()
    return [t.cpu() for t in tensors]


def manager_all_gather_into_tensor(async_ops: bool):
    n = ctx.world_size
    inputs = [stacked(ctx.rank, i, n).to(ctx.device) for i in range(3)]
    outputs = [torch.full((n * t.numel(),), -1.0, device=ctx.device) for t in inputs]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for out, tensor in zip(outputs, inputs):
            dist.all_gather_into_tensor(out, tensor)
    if async_ops:
        cm.wait()
    return [t.cpu() for t in outputs]


def manager_reduce_scatter_tensor(op: str, async_ops: bool):
    n = ctx.world_size
    inputs = [stacked(ctx.rank, i, n).to(ctx.device) for i in range(3)]
    outputs = [torch.full((t.numel() // n,), -1.0, device=ctx.device) for t in inputs]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for out, tensor in zip(outputs, inputs):
            dist.reduce_scatter_tensor(out, tensor, op=values.reduce_op(op))
    if async_ops:
        cm.wait()
    return [t.cpu() for t in outputs]


def table_chunks(entry: collectives.Collective, rank: int, index: int, world_size: int) -> list:
    """Rank ``rank``'s input chunks of call ``index`` (of 3) of a table collective: sizes differ per call."""
    if not entry.inputs.passed_by(rank == world_size - 1):
        return []
    return [values.rank_payload(rank, index + 2, "float32", salt=100 * index + 10 * j)
            for j in range(entry.inputs.count(world_size))]


def manager_table_calls(collective: str, async_ops: bool, with_device: bool = False) -> list:
    """Three calls of a table collective (SUM, root the last rank) inside _coalescing_manager: per call, this
    rank's result chunks."""
    entry, n = collectives.get(collective), ctx.world_size

    def output_of(i: int):
        """The output maker of call ``i``: a tensor of its size on the rank's device, filled with -1."""
        return lambda j: torch.full((i + 2,), -1.0, device=ctx.device)

    calls = [collectives.args_for(entry, [t.to(ctx.device) for t in table_chunks(entry, ctx.rank, i, n)],
                                  output_of(i), group_size=n, is_root=ctx.rank == n - 1,
                                  op=values.reduce_op("sum"), root=n - 1)
             for i in range(3)]
    # with a device, c10d also brackets the calls with the group's _start_coalescing/_end_coalescing
    device = torch.device(ctx.device) if with_device else None
    with dist._coalescing_manager(device=device, async_ops=async_ops) as cm:
        for args in calls:
            entry.issue(args)
    if async_ops:
        cm.wait()
    return [[t.cpu() for t in collectives.result_chunks(entry, a, [i + 2] * n)] for i, a in enumerate(calls)]


def manager_p2p(messages: int = 2) -> list:
    """The last rank sends rank 0 ``messages`` tensors, each side inside _coalescing_manager(device=...,
    async_ops=True) (the group's start/end coalescing bracket them, as batch_isend_irecv does for a backend that
    advertises supports_coalescing). The sender starts only once rank 0 has left its manager, so rank 0's
    cm.wait() is all that can make the messages land before it looks: rank 0's buffers after it. A Work that
    says it is done before the sender was even let go is looked at right then (what "done" left in the buffers),
    so a Work that leaves the receives out shows every time, not only when rank 0 outruns the sender."""
    last, posted = ctx.world_size - 1, f"coalesced-p2p/{ctx.case_id}/posted"
    device = torch.device(ctx.device)
    if ctx.rank == last:
        ctx.store.wait([posted], timedelta(seconds=30))
        with dist._coalescing_manager(device=device, async_ops=True) as cm:
            for i in range(messages):
                dist.isend(sent(salt=P2P_SALT + i), 0)
        cm.wait()
        return []
    if ctx.rank != 0:
        return []
    incoming = [decoy(payload(last, salt=P2P_SALT + i)) for i in range(messages)]
    try:
        with dist._coalescing_manager(device=device, async_ops=True) as cm:
            for buffer in incoming:
                dist.irecv(buffer, last)
    except BaseException:  # a backend without coalescing raised above: the sender is not kept waiting for nothing
        ctx.store.set(posted, "1")
        raise
    done_before_sent = bool(cm.works) and all(work.is_completed() for work in cm.works)
    seen = [t.to("cpu", copy=True) for t in incoming] if done_before_sent else None
    ctx.store.set(posted, "1")
    cm.wait()
    return seen or [t.cpu() for t in incoming]


def all_reduce_coalesced(op: str, dtype: str, async_op: bool):
    tensors = [t.to(ctx.device) for t in inputs_of(ctx.rank, op, dtype)]
    future = dist.all_reduce_coalesced(tensors, op=values.reduce_op(op), async_op=async_op)
    if async_op:
        future.wait()  # all_reduce_coalesced(async_op=True) returns the Work's future
    return [t.cpu() for t in tensors]


def all_gather_coalesced(async_op: bool):
    mine = [t.to(ctx.device) for t in inputs_of(ctx.rank, "sum", "float32")]
    outputs = [[torch.full_like(t, -1.0) for t in mine] for _ in range(ctx.world_size)]
    work = dist.all_gather_coalesced(outputs, mine, async_op=async_op)
    if async_op:
        work.wait()
    return [[t.cpu() for t in per_rank] for per_rank in outputs]


# ------------------------------------------------------------------ clauses
def _expect_all_reduced(results, op, dtype, n, what):
    expected = semantics.all_reduce_coalesced([inputs_of(r, op, dtype) for r in range(n)], op)
    for rank, tensors in enumerate(results):
        for i, (got, want) in enumerate(zip(tensors, expected[rank])):
            expect_tensor(got, want, f"{what}: tensor {i} on rank {rank}", exact=op != "avg")


ALL_REDUCE_CASES = [("sum", "float32"), ("max", "int64"), ("product", "float64"), ("avg", "float32"),
                    ("bxor", "int32")]


@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("async_ops", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", ALL_REDUCE_CASES, ids=[f"{o}-{d}" for o, d in ALL_REDUCE_CASES])
def test_coalescing_manager_all_reduce(world, op, dtype, async_ops):
    """all_reduce calls inside _coalescing_manager each get their own exact reduction."""
    results = world.run(manager_all_reduce, op, dtype, async_ops)
    _expect_all_reduced(results, op, dtype, world.world_size, f"coalesced all_reduce {op} {dtype}")


@pytest.mark.parametrize("async_ops", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("collective", [
    pytest.param(c.name, id=c.name, marks=pytest.mark.needs(collective=c.family, form="device"))
    for c in collectives.coalescing_managed()])
def test_coalescing_manager_with_device(world, collective, async_ops):
    """_coalescing_manager(device=...) (start/end coalescing on the group) gives the same exact results."""
    n, entry = world.world_size, collectives.get(collective)
    expected = [entry.oracle([table_chunks(entry, r, i, n) for r in range(n)], "sum" if entry.reduces else None,
                             n - 1 if entry.rooted else None) for i in range(3)]
    for rank, outputs in enumerate(world.run(manager_table_calls, collective, async_ops, True)):
        for i, got in enumerate(outputs):
            for j, (g, want) in enumerate(zip(got, expected[i][rank])):
                if want is not None:
                    expect_tensor(g, want, f"coalesced {collective} {i} with device on rank {rank} (chunk {j})")


@pytest.mark.needs(collective="send_recv", form="device")
@pytest.mark.min_world_size(2)
def test_coalescing_manager_with_device_p2p(world):
    """isend/irecv inside _coalescing_manager(device=...) are part of its Work: once it is done every buffer holds its message."""
    last = world.world_size - 1
    for i, got in enumerate(world.run(manager_p2p)[0]):
        expect_tensor(got, payload(last, salt=P2P_SALT + i), f"coalesced irecv {i} from rank {last} on rank 0")


@pytest.mark.needs(collective="all_gather")
@pytest.mark.parametrize("async_ops", [False, True], ids=["sync", "async"])
def test_coalescing_manager_all_gather_into_tensor(world, async_ops):
    """all_gather_into_tensor calls inside _coalescing_manager each fill their own output in rank order."""
    n = world.world_size
    for rank, outputs in enumerate(world.run(manager_all_gather_into_tensor, async_ops)):
        for i, got in enumerate(outputs):
            want = semantics.all_gather_into_tensor([stacked(r, i, n) for r in range(n)])[rank]
            expect_tensor(got, want, f"coalesced all_gather_into_tensor {i} on rank {rank}")


@pytest.mark.needs(collective="reduce_scatter")
@pytest.mark.parametrize("async_ops", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_coalescing_manager_reduce_scatter_tensor(world, op, async_ops):
    """reduce_scatter_tensor calls inside _coalescing_manager each give rank i the reduction of chunk i."""
    n = world.world_size
    for rank, outputs in enumerate(world.run(manager_reduce_scatter_tensor, op, async_ops)):
        for i, got in enumerate(outputs):
            want = semantics.reduce_scatter_tensor([stacked(r, i, n) for r in range(n)], op)[rank]
            expect_tensor(got, want, f"coalesced reduce_scatter_tensor {op} {i} on rank {rank}")


@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", ALL_REDUCE_CASES, ids=[f"{o}-{d}" for o, d in ALL_REDUCE_CASES])
def test_all_reduce_coalesced(world, op, dtype, async_op):
    """all_reduce_coalesced reduces each tensor of the list exactly, as separate all_reduces would."""
    results = world.run(all_reduce_coalesced, op, dtype, async_op)
    _expect_all_reduced(results, op, dtype, world.world_size, f"all_reduce_coalesced {op} {dtype}")


@pytest.mark.needs(collective="all_gather", clause="test_all_gather_coalesced")
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_all_gather_coalesced(world, async_op):
    """all_gather_coalesced gives every rank output[r][i] == rank r's tensor i."""
    n = world.world_size
    expected = semantics.all_gather_coalesced([inputs_of(r, "sum", "float32") for r in range(n)])
    for rank, outputs in enumerate(world.run(all_gather_coalesced, async_op)):
        for source in range(n):
            for i, got in enumerate(outputs[source]):
                expect_tensor(got, expected[rank][source][i],
                              f"all_gather_coalesced output[{source}][{i}] on rank {rank}")
