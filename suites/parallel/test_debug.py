"""Contract: under TORCH_DISTRIBUTED_DEBUG=DETAIL a collective mismatch is reported, not suffered.

Run with ``--debug-level DETAIL`` (the ranks get TORCH_DISTRIBUTED_DEBUG and
torch wraps C++ backends in its ProcessGroupWrapper, which compares every
collective's fingerprint across ranks before running it). An all_reduce whose
ranks disagree on the shape (13 elements on rank 0, 17 elsewhere) must raise on
every rank an error naming both shapes. torch 2.13's text, on gloo:
"Detected mismatch between collectives on ranks. Rank 0 is running collective:
CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[13], ...),
but Rank 1 is running collective: CollectiveFingerPrint(... TensorShape=[17] ...)
... Collectives differ in the following aspects: Tensor Tensor shapes: 13vs 17".
torch does not wrap a backend whose creator returns a ProcessGroup subclass
(the reference, Python plugins): those must check agreement themselves. At
other debug levels the clause is skipped (suites/c10d/test_bad_input.py holds
every backend to raising on bad input at any level).
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx

pytestmark = pytest.mark.needs(feature="debug_wrapper", collective="all_reduce")

GROUP_TIMEOUT_S = 2.0
SHAPES = (13, 17)


# ---------------------------------------------------------------- rank side
def mismatched_all_reduce():
    group = dist.new_group(timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    tensor = torch.ones(SHAPES[0] if ctx.rank == 0 else SHAPES[1], device=ctx.device)
    start = time.perf_counter()
    try:
        dist.all_reduce(tensor, group=group)
        seconds = time.perf_counter() - start
        outcome = ("returned", f"shape {tuple(tensor.shape)} sum {tensor.sum().item()}")
    except Exception as exc:
        seconds = time.perf_counter() - start  # before the error is read: rendering a C++ backtrace takes time
        outcome = ("raised", f"{type(exc).__name__}: {exc}")
    ctx.store.set(f"done/{ctx.rank}", "1")
    ctx.store.wait([f"done/{r}" for r in range(ctx.world_size)], timedelta(seconds=60))
    dist.destroy_process_group(group)
    return outcome + (round(seconds, 3), dist.get_debug_level().name)


def collective_after_partial_p2p():
    """Rank 0 sends to rank 1 (the others take no part), then every rank all_reduces: a correct program."""
    group = dist.new_group(timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    try:
        if ctx.rank == 0:
            dist.send(torch.ones(2, device=ctx.device), dst=1, group=group)
        elif ctx.rank == 1:
            dist.recv(torch.empty(2, device=ctx.device), src=0, group=group)
        dist.all_reduce(tensor, group=group)
        outcome = ("returned", tensor.cpu())
    except Exception as exc:
        outcome = ("raised", f"{type(exc).__name__}: {exc}")
    ctx.store.set(f"done/{ctx.rank}", "1")
    ctx.store.wait([f"done/{r}" for r in range(ctx.world_size)], timedelta(seconds=60))
    dist.destroy_process_group(group)
    return outcome


# ------------------------------------------------------------------ clauses
def test_detail_reports_shape_mismatch(world, record_property):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL an all_reduce with mismatched shapes raises on every rank naming both shapes."""
    if getattr(world, "debug_level", "OFF") != "DETAIL":
        pytest.skip("runs under --debug-level DETAIL only (the debug wrapper is off at this level)")
    results = world.run(mismatched_all_reduce)
    for rank, (how, detail, seconds, level) in enumerate(results):
        record_property("finding", f"rank {rank} ({level}) {how} after {seconds:.2f} s: {detail[:600]}")
        assert level == "DETAIL", f"rank {rank} runs at debug level {level}, not DETAIL"
        assert how == "raised", f"rank {rank}: no error for mismatched shapes ({detail})"
        named = [n for n in SHAPES if re.search(rf"\b{n}\b", detail)]
        assert named == list(SHAPES), f"rank {rank}: the error does not name both shapes {SHAPES}: {detail[:600]}"


@pytest.mark.min_world_size(3)
@pytest.mark.needs(collective="send_recv")
def test_detail_collective_after_partial_p2p(world, record_property):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL a collective after send/recv between some of the ranks runs and is exact."""
    if getattr(world, "debug_level", "OFF") != "DETAIL":
        pytest.skip("runs under --debug-level DETAIL only (the debug wrapper is off at this level)")
    results = world.run(collective_after_partial_p2p)
    expected = torch.full((4,), float(sum(range(1, world.world_size + 1))))
    for rank, (how, detail) in enumerate(results):
        if how == "raised":
            record_property("finding", f"rank {rank} raised: {detail[:600]}")
        assert how == "returned", f"rank {rank}: the all_reduce after rank 0 -> 1 send/recv raised: {detail[:600]}"
        assert torch.equal(detail, expected), f"rank {rank}: {detail.tolist()}, expected {expected.tolist()}"
