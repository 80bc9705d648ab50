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
    """
    return dist.new_group(ranks=ranks, timeout=timedelta(seconds=timeout_s))


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
