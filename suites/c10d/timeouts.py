"""Rank-side helpers for clauses where one rank deliberately stays away."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import collectives


def fresh_group(timeout_s: float, ranks=None):
    """A new group with its own timeout, entered by every rank of the world.

    Never cached: a group that has seen a timeout is unusable afterwards.
    For clauses about ``new_group(timeout=...)`` itself; a clause that only
    needs its operations bounded takes ``bounded_group``.
    """
    return dist.new_group(ranks=ranks, timeout=timedelta(seconds=timeout_s))


def bounded_group(timeout_s: float):
    """A new group of the whole world whose operations time out after ``timeout_s``, connected under the world's
    long timeout.

    gloo connects a new group's full mesh under the group's own timeout: with a
    sub-second one, a loaded machine failed the connect itself ("Connect
    timeout" in a control run beside two other test runs), before the clause's
    operation ran. So the group is made under the world's timeout and then
    narrowed with ``ProcessGroup.set_timeout``. A backend that refuses to
    narrow (c10d's base Backend does) gets ``new_group(timeout=...)`` instead:
    the refusal is the same on every rank, so every rank makes the same group.
    """
    assert ctx.config is not None, "bounded_group runs inside a rank"
    group = dist.new_group(timeout=timedelta(seconds=ctx.config.pg_timeout))
    try:
        group.set_timeout(timedelta(seconds=timeout_s))
    except RuntimeError:
        dist.destroy_process_group(group)
        return fresh_group(timeout_s)
    return group


def call_while_one_rank_skips(operation, timeout_s: float, absent: int, ranks=None):
    """Every member but ``absent`` calls ``operation(group)``; report how each call ended.

    Returns (raised, seconds, error text) for participants and None for the absent rank
    and for non-members. The group is destroyed afterwards on every rank.
    """
    group = fresh_group(timeout_s, ranks)
    outcome = None
    member = ranks is None or ctx.rank in ranks
    participants = [r for r in (ranks if ranks is not None else range(ctx.world_size)) if r != absent]
    if member and ctx.rank != absent:
        start = time.perf_counter()
        try:
            operation(group)
            outcome = (False, time.perf_counter() - start, "")
        except Exception as exc:  # the finding: the backend's own error text
            outcome = (True, time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
        ctx.store.set(f"finished/{ctx.rank}", "1")
    elif ctx.rank == absent:
        # Stay away from the operation but keep the group open until the others
        # are done: closing it early would fail them with "connection closed"
        # at once, and the timeout would never be exercised.
        ctx.store.wait([f"finished/{r}" for r in participants], timedelta(seconds=timeout_s + 60))
    if member:
        dist.destroy_process_group(group)
    return outcome


def store_barrier(tag: str, ranks) -> None:
    """Every rank of ``ranks`` has reached this point (through the case's store, not the backend)."""
    ctx.store.set(f"{tag}/{ctx.rank}", "1")
    ctx.store.wait([f"{tag}/{r}" for r in ranks], timedelta(seconds=60))


def timed(operation) -> tuple[bool, float, str]:
    """Run ``operation()``: (raised, seconds, error text)."""
    start = time.perf_counter()
    try:
        operation()
        return False, time.perf_counter() - start, ""
    except Exception as exc:  # the finding: the backend's own error text
        return True, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"


def call_with_one_rank_late(operation, timeout_s: float, late: int, late_by_s: float):
    """Every rank calls ``operation(group)`` on a fresh group with timeout ``timeout_s``; rank ``late``
    starts ``late_by_s`` after the others (they start together, released by a store barrier).

    Returns (raised, seconds, error text) on every rank; the group is destroyed afterwards."""
    group = fresh_group(timeout_s)
    store_barrier("start", range(ctx.world_size))
    if ctx.rank == late:
        time.sleep(late_by_s)
    outcome = timed(lambda: operation(group))
    store_barrier("finished", range(ctx.world_size))  # no rank leaves the group while another still uses it
    dist.destroy_process_group(group)
    return outcome


def issue_small(name: str, group, root: int | None, async_op: bool = False, numel: int = 4):
    """Issue collective ``name`` of the table on ``group`` with small tensors, as its entry lays them out.

    ``root``: global rank of the root (rooted collectives). Waits for an
    async call's Work, so a timeout surfaces here either way.
    """
    entry = collectives.get(name)
    n = dist.get_world_size(group)
    is_root = ctx.rank == root

    def side(slots, make):
        if slots is None or not slots.passed_by(is_root):
            return []
        return collectives.pack(slots, [make(numel, device=ctx.device) for _ in range(slots.count(n))])

    args = collectives.Args(side(entry.inputs, torch.ones), side(entry.outputs, torch.zeros),
                            op=dist.ReduceOp.SUM if entry.reduces else None, root=root if entry.rooted else None,
                            group=group, async_op=async_op)
    work = entry.issue(args)
    if async_op:
        work.wait()


# ------------------------------------------------------------ pytest side
SLACK_S = 5.0  # how late after the timeout an error may come


def expect_late_rank_waited_for(results, operation: str, late_by_s: float, timeout_s: float, record_property,
                                bound=None) -> None:
    """Nobody raised; every ``bound`` rank (default: all but the late, last one) waited for the late rank:
    its call took at least half of ``late_by_s`` (a real lower bound: the start is aligned by a store
    barrier) and returned before the group's timeout."""
    late = len(results) - 1
    bound = range(late) if bound is None else bound
    for rank, (raised, seconds, error) in enumerate(results):
        assert not raised, (f"rank {rank}: {operation} raised after {seconds:.2f} s although rank {late} came only "
                            f"{late_by_s:g} s late, well within the group's {timeout_s:g} s timeout: {error}")
    for rank in bound:
        seconds = results[rank][1]
        assert late_by_s * 0.5 <= seconds < timeout_s, \
            f"rank {rank}: {operation} returned after {seconds:.2f} s, outside [{late_by_s * 0.5:g}, {timeout_s:g}) s " \
            f"with rank {late} {late_by_s:g} s late"
    record_property("finding", f"{operation}: waiting ranks returned after "
                               f"{', '.join(f'{results[r][1]:.2f}' for r in bound)} s")


def expect_timeout_errors(results, operation: str, timeout_s: float, record_property, bound=None) -> None:
    """Every ``bound`` rank (default: all but the absent, last one) raised within [timeout, timeout + SLACK_S];
    record every error. Another participant may also have returned: it did not need the absent rank."""
    absent = len(results) - 1
    bound = range(absent) if bound is None else bound
    for rank, outcome in enumerate(results[:absent]):
        raised, seconds, error = outcome
        if rank not in bound:
            if raised:
                record_property("finding", f"{operation} on rank {rank} after {seconds:.2f} s: {error.splitlines()[0]}")
            continue
        assert raised, f"rank {rank}: {operation} returned after {seconds:.2f} s although rank {absent} never came"
        assert timeout_s * 0.95 <= seconds <= timeout_s + SLACK_S, \
            f"rank {rank}: {operation} raised after {seconds:.2f} s, outside [{timeout_s}, {timeout_s + SLACK_S}] s"
        record_property("finding", f"{operation} on rank {rank} after {seconds:.2f} s: {error.splitlines()[0]}")
