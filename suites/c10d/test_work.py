"""Contract: the Work API and sequence numbers.

An async collective returns a Work that says the truth about it:
``is_completed()`` is False while a member has not arrived and True after
``wait()``; a successful Work has ``is_success()``, no ``exception()``, and
its ``get_future().value()`` and ``result()`` are the output tensors;
``wait(timeout)`` raises when the timeout expires first, in c10d's wording
("Timed out ..." / "... timed out ...") that users' error patterns match; a
Work that failed is completed, not successful, and carries the error in
``exception()`` and in its future. The group's sequence number
(``_get_sequence_number_for_group``, PyTorch's supports_work_sequence_number)
is the same on every rank and grows by one per collective.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import collectives
from suites.c10d.timeouts import SLACK_S, bounded_group, fresh_group
from suites.checks import expect_tensor

TIMED_OUT = re.compile(r"[Tt]imed out")
WAIT_TIMEOUT_S = 0.4
GROUP_TIMEOUT_S = 0.5
ABSENT_FOR_S = 1.5  # how long the late rank stays away in the wait(timeout) clause


def contribution(rank: int) -> torch.Tensor:
    return torch.arange(4, dtype=torch.float32) + 10 * rank


def summed(world_size: int) -> torch.Tensor:
    return sum(contribution(r) for r in range(world_size))


def tensors_of(value) -> list:
    """A future's value as a flat list of cpu tensors (backends return a list, or a list of lists)."""
    if isinstance(value, torch.Tensor):
        return [value.cpu()]
    return [t for v in value for t in tensors_of(v)]


# ---------------------------------------------------------------- rank side
def completed_work_state():
    tensor = contribution(ctx.rank).to(ctx.device)
    work = dist.all_reduce(tensor, async_op=True)
    waited = work.wait()
    return {
        "wait": waited, "completed": work.is_completed(), "success": work.is_success(),
        "exception": repr(work.exception()) if work.exception() is not None else None,
        "future": tensors_of(work.get_future().value()), "result": tensors_of(work.result()),
        "tensor": tensor.cpu(),
    }


def snapshot_when_the_future_completes():
    """A callback on the Work's future copies the output the moment the future completes.

    The last rank joins 0.1 s late, so a Work marked complete when its job
    starts (before the data has landed) is seen holding this rank's own input.
    """
    tensor = contribution(ctx.rank).to(ctx.device)
    if ctx.rank == ctx.world_size - 1:
        time.sleep(0.1)
    work = dist.all_reduce(tensor, async_op=True)
    snapshot = work.get_future().then(lambda _: tensor.clone()).wait()
    work.wait()
    return snapshot.cpu()


def incomplete_while_a_rank_is_away():
    """The last rank joins only after the others have looked at their Work."""
    last = ctx.world_size - 1
    tensor = contribution(ctx.rank).to(ctx.device)
    if ctx.rank == last:
        ctx.store.wait([f"looked/{r}" for r in range(last)], timedelta(seconds=30))
        dist.all_reduce(tensor)
        return None, True, tensor.cpu()
    work = dist.all_reduce(tensor, async_op=True)
    time.sleep(0.2)
    early = work.is_completed()
    ctx.store.set(f"looked/{ctx.rank}", "1")
    work.wait()
    return early, work.is_completed(), tensor.cpu()


def wait_with_timeout_while_a_rank_is_away():
    """Work.wait(timeout) on the others expires while the last rank is away; once it arrives, wait() completes."""
    last = ctx.world_size - 1
    group = fresh_group(60.0)  # a long group timeout: only wait()'s own timeout may fire
    tensor = contribution(ctx.rank).to(ctx.device)
    outcome = None
    if ctx.rank == last:
        ctx.store.wait([f"expired/{r}" for r in range(last)], timedelta(seconds=30))
        dist.all_reduce(tensor, group=group)
    else:
        work = dist.all_reduce(tensor, group=group, async_op=True)
        start = time.perf_counter()
        try:
            work.wait(timeout=timedelta(seconds=WAIT_TIMEOUT_S))
            outcome = (False, time.perf_counter() - start, "")
        except Exception as exc:  # the finding: the backend's own words
            outcome = (True, time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
        ctx.store.set(f"expired/{ctx.rank}", "1")
        work.wait()  # the expiry gave up waiting, it did not cancel the collective
    dist.destroy_process_group(group)
    return outcome, tensor.cpu()


def failed_work_state():
    """A Work whose collective times out in its group (the last rank never comes) reports the failure."""
    last = ctx.world_size - 1
    group = bounded_group(GROUP_TIMEOUT_S)
    state = None
    if ctx.rank != last:
        work = dist.all_reduce(contribution(ctx.rank).to(ctx.device), group=group, async_op=True)
        try:
            work.wait()
            raised = None
        except Exception as exc:
            raised = f"{type(exc).__name__}: {exc}"
        future_error = None
        try:
            work.get_future().value()
        except Exception as exc:
            future_error = f"{type(exc).__name__}: {exc}"
        exception = work.exception()
        state = {"raised": raised, "completed": work.is_completed(), "success": work.is_success(),
                 "exception": None if exception is None else f"{type(exception).__name__}: {exception}",
                 "future_error": future_error}
        ctx.store.set(f"finished/{ctx.rank}", "1")
    # Nobody destroys the group before every participant has seen its own timeout: a peer closing its
    # connections early would fail the others with "connection closed" instead (seen on gloo at 4 ranks).
    ctx.store.wait([f"finished/{r}" for r in range(last)], timedelta(seconds=GROUP_TIMEOUT_S + 60))
    dist.destroy_process_group(group)
    return state


def _t(numel: int = 4) -> torch.Tensor:
    return torch.ones(numel, device=ctx.device)


BARRIER = "barrier"  # moves no data, so not in the table of collectives, but sequenced like one


def sequenced_call(name: str, group, call: int):
    """Call ``name`` (a collective of suites/collectives.py, or barrier) once on ``group``, a group of every rank,
    async on every other call: both spellings must count once. Returns the Work or None."""
    if name == BARRIER:
        return dist.barrier(group=group, async_op=bool(call % 2))
    entry = collectives.get(name)
    n = ctx.world_size
    is_root = ctx.rank == n - 1
    chunks = [_t() for _ in range(entry.inputs.count(n))] if entry.inputs.passed_by(is_root) else []
    args = collectives.args_for(entry, chunks, lambda j: _t(), group_size=n, is_root=is_root, op=dist.ReduceOp.SUM,
                                root=n - 1, group=group, async_op=bool(call % 2))
    return entry.issue(args)


def timed_all_reduce():
    """Duration c10d's collectives timing reports for one all_reduce, and the wall time around it (both ms)."""
    group = dist.new_group()
    group._enable_collectives_timing()
    tensor = contribution(ctx.rank).to(ctx.device)
    start = time.perf_counter()
    work = dist.all_reduce(tensor, group=group, async_op=True)
    work.wait()
    wall_ms = (time.perf_counter() - start) * 1000
    try:
        return work._get_duration(), wall_ms
    finally:
        dist.destroy_process_group(group)


def sequence_numbers(collective: str, times: int = 3):
    """The group's sequence number before and after each of ``times`` calls of one collective."""
    group = ctx.scratch.get("sequenced_group")
    if group is None:
        group = ctx.scratch["sequenced_group"] = dist.new_group()
    seen = [group._get_sequence_number_for_group()]
    for i in range(times):
        work = sequenced_call(collective, group, i)
        if work is not None:
            work.wait()
        seen.append(group._get_sequence_number_for_group())
    return seen


# ------------------------------------------------------------------ clauses
pytestmark = pytest.mark.needs(collective="all_reduce", feature="work_api")


@pytest.mark.needs(clause="test_completed_work_reports_success_and_values")
def test_completed_work_reports_success_and_values(world):
    """After wait(): is_completed and is_success are True, exception() is None, get_future() and result() hold the output."""
    expected = summed(world.world_size)
    for rank, state in enumerate(world.run(completed_work_state)):
        assert state["completed"] is True, f"rank {rank}: is_completed() is {state['completed']} after wait()"
        assert state["success"] is True, f"rank {rank}: is_success() is {state['success']} after wait()"
        assert state["exception"] is None, f"rank {rank}: exception() is {state['exception']} for a successful Work"
        expect_tensor(state["tensor"], expected, f"rank {rank}: the all_reduce output")
        for name in ("future", "result"):
            assert len(state[name]) == 1, f"rank {rank}: {name} holds {len(state[name])} tensors, expected 1"
            expect_tensor(state[name][0], expected, f"rank {rank}: Work.{name} value")


def test_future_completes_after_the_data_has_landed(world):
    """A callback on an async Work's future sees the finished output: the future completes only after the data has landed."""
    expected = summed(world.world_size)
    for rank, snapshot in enumerate(world.run(snapshot_when_the_future_completes)):
        expect_tensor(snapshot, expected, f"rank {rank}: the output as the future's callback saw it")


@pytest.mark.min_world_size(2)
@pytest.mark.needs(work="member_away")
@pytest.mark.needs(clause="test_work_not_completed_while_a_member_is_away")
def test_work_not_completed_while_a_member_is_away(world):
    """is_completed() is False while a member has not joined the collective, True after wait()."""
    expected = summed(world.world_size)
    for rank, (early, late, tensor) in enumerate(world.run(incomplete_while_a_rank_is_away)):
        if rank != world.world_size - 1:
            assert early is False, f"rank {rank}: is_completed() was True before the last rank joined"
            assert late is True, f"rank {rank}: is_completed() is False after wait()"
        expect_tensor(tensor, expected, f"rank {rank}: the all_reduce output")


@pytest.mark.min_world_size(2)
@pytest.mark.needs(feature="work_wait_timeout", work="member_away")
def test_wait_timeout_raises_on_expiry(world, record_property):
    """Work.wait(timeout) raises within [timeout, timeout + 5 s] ('Timed out') while a member is away; a later wait() completes."""
    results = world.run(wait_with_timeout_while_a_rank_is_away)
    for rank, (_, tensor) in enumerate(results):
        expect_tensor(tensor, summed(world.world_size), f"rank {rank}: the all_reduce output after the late rank came")
    for rank, (outcome, _) in enumerate(results[:-1]):
        raised, seconds, error = outcome
        assert raised, f"rank {rank}: wait({WAIT_TIMEOUT_S} s) returned after {seconds:.2f} s with a rank away"
        assert WAIT_TIMEOUT_S * 0.95 <= seconds <= WAIT_TIMEOUT_S + SLACK_S, \
            f"rank {rank}: wait({WAIT_TIMEOUT_S} s) raised after {seconds:.2f} s"
        assert TIMED_OUT.search(error), f"rank {rank}: the error does not say 'Timed out': {error}"
        record_property("finding", f"wait(timeout) on rank {rank}: {error.splitlines()[0]}")


@pytest.mark.min_world_size(2)
@pytest.mark.needs(feature="group_timeout", work="member_away")
@pytest.mark.needs(clause="test_failed_work_reports_its_error")
def test_failed_work_reports_its_error(world, record_property):
    """A Work that failed (group timeout) is completed, not successful; exception() and its future carry the error."""
    for rank, state in enumerate(world.run(failed_work_state)[:-1]):
        assert state["raised"], f"rank {rank}: wait() returned although the last rank never came"
        assert TIMED_OUT.search(state["raised"]), f"rank {rank}: the error does not say 'Timed out': {state['raised']}"
        assert state["completed"] is True, f"rank {rank}: is_completed() is False after the Work failed"
        assert state["success"] is False, f"rank {rank}: is_success() is True for a failed Work"
        assert state["exception"], f"rank {rank}: exception() is None for a failed Work"
        assert state["future_error"], f"rank {rank}: get_future().value() did not raise for a failed Work"
        record_property("finding", f"rank {rank}: {state['raised'].splitlines()[0]}")


@pytest.mark.needs(feature="work_sequence_number")
@pytest.mark.parametrize("collective", [pytest.param(entry.name, marks=pytest.mark.needs(**entry.need()))
                                        for entry in collectives.TABLE.values()] + [BARRIER])
def test_sequence_number_same_on_every_rank_and_plus_one_per_collective(world, collective):
    """_get_sequence_number_for_group is equal on every rank and grows by exactly one per collective."""
    results = world.run(sequence_numbers, collective)
    for rank, seen in enumerate(results):
        assert seen == results[0], f"rank {rank} saw sequence numbers {seen}, rank 0 saw {results[0]}"
    for a, b in zip(results[0], results[0][1:]):
        assert b == a + 1, f"{collective}: the sequence number went from {a} to {b}, expected {a + 1}"


@pytest.mark.needs(work="duration")  # with the module's feature="work_api"
def test_collectives_timing_duration(world):
    """With _enable_collectives_timing, a completed Work's _get_duration() is its run time in ms (> 0, <= the wall time)."""
    for rank, (duration, wall_ms) in enumerate(world.run(timed_all_reduce)):
        assert 0 < duration <= wall_ms + 1.0, \
            f"rank {rank}: _get_duration() is {duration} ms for an all_reduce that took {wall_ms:.3f} ms from issue to wait"
