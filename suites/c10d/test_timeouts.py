"""Contract: a collective that one rank skips raises on the others within the group's timeout, and one it
joins late (well within the timeout, or within a Work.wait(timeout)) succeeds.

The group is made inside the live world with new_group(timeout=...): no world
restart, and the default group is never exposed to the timeout.

Every collective of suites/collectives.py is a case (and those whose record says
``async_entry_point``, all_reduce, once more through async_op=True and
Work.wait()). The absent rank is the last one. When data flows from a root
(broadcast, scatter) the absent rank is the root, so every other rank waits
for it and must raise. When data flows into a root
(reduce, gather) rank 0 is the root: it waits for the absent rank's
contribution and must raise; the other ranks may legitimately finish their
send without the absent rank, so they may return or raise.

Each timeout clause has its negative twin, so a backend that times out too
early fails too: the same collective on a group with a LATE_TIMEOUT_S timeout,
the last rank starting LATE_BY_S after the others (released together by a
store barrier), succeeds on every rank, and the ranks that need the late one
return after at least half of LATE_BY_S and before the timeout. Per operation,
Work.wait(timeout) on a collective whose last rank comes LATE_BY_S late returns
(its expiry is suites/c10d/test_work.py's clause).

The group after a timeout (the last rank skipped an all_reduce, the others'
timed out, then every rank calls all_reduce on it again) does what the
backend declares (``BackendSpec.after_timeout``): every rank's call succeeds,
or every rank's raises within half the group's timeout with the declared
error; undeclared, every rank gets the same outcome. Never a hang.
"""

import pytest

import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import collectives
from suites.c10d.timeouts import (
    call_while_one_rank_skips,
    call_with_one_rank_late,
    expect_late_rank_waited_for,
    expect_timeout_errors,
    fresh_group,
    SLACK_S,
    issue_small,
    store_barrier,
    timed,
)
from suites.checks import expect_tensor

pytestmark = [pytest.mark.needs(feature="group_timeout"), pytest.mark.waits]  # every clause waits on a timeout or a late rank

TIMEOUT_S = 0.5
# The negative twins: a rank this late against a timeout this long has seconds of slack on a loaded machine,
# and a backend that cuts the timeout to under LATE_BY_S fails.
LATE_TIMEOUT_S = 6.0
LATE_BY_S = 1.5
# A group timeout the per-operation clauses never reach (it is not the one they check; the harness deadline is
# shorter, so a backend that ignores the operation's timeout fails the case with every rank's stack).
GROUP_TIMEOUT_LONG_S = 120.0
# The group after a timeout: long enough that "at once" (half of it) and "after the timeout again" differ.
AFTER_TIMEOUT_GROUP_S = 3.0


def cases() -> list:
    """(case id, collective name, async_op) for every collective of the table, and once more with
    async_op=True (the error surfacing from Work.wait()) for those the table issues async too."""
    entries = list(collectives.TABLE.values())
    return [(c.name, c.name, False) for c in entries] + [(f"async_{c.name}", c.name, True)
                                                          for c in entries if c.async_entry_point]


def root_of(name: str, world_size: int) -> int | None:
    """The root of a rooted collective: the absent rank when data comes from it, else rank 0."""
    entry = collectives.get(name)
    if not entry.rooted:
        return None
    return 0 if entry.flow == collectives.TO_ROOT else world_size - 1


def skip_on_last_rank(name: str, async_op: bool):
    root = root_of(name, ctx.world_size)
    return call_while_one_rank_skips(lambda g: issue_small(name, g, root=root, async_op=async_op),
                                     TIMEOUT_S, absent=ctx.world_size - 1)


def last_rank_late(name: str, async_op: bool):
    root = root_of(name, ctx.world_size)
    return call_with_one_rank_late(lambda g: issue_small(name, g, root=root, async_op=async_op),
                                   LATE_TIMEOUT_S, late=ctx.world_size - 1, late_by_s=LATE_BY_S)


def wait_with_timeout_for_a_late_rank():
    """Work.wait(LATE_TIMEOUT_S) on an all_reduce the last rank joins LATE_BY_S late; the group's own timeout is
    long, so only wait()'s may fire. Returns ((raised, seconds, error), the output)."""
    last = ctx.world_size - 1
    group = fresh_group(60.0)
    tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    store_barrier("start", range(ctx.world_size))
    if ctx.rank == last:
        time.sleep(LATE_BY_S)
    outcome = timed(lambda: dist.all_reduce(tensor, group=group, async_op=True).wait(
        timeout=timedelta(seconds=LATE_TIMEOUT_S)))
    store_barrier("finished", range(ctx.world_size))
    dist.destroy_process_group(group)
    return outcome, tensor.cpu()


def next_collective_after_a_timeout():
    """The last rank skips an all_reduce on a fresh group, the others' times out; then every rank calls
    all_reduce on that group again. Returns (the first call's outcome, None on the last rank; the next call's
    outcome; the next call's output)."""
    last = ctx.world_size - 1
    group = fresh_group(AFTER_TIMEOUT_GROUP_S)
    first = None
    if ctx.rank != last:
        first = timed(lambda: dist.all_reduce(torch.ones(4, device=ctx.device), group=group))
    store_barrier("timed_out", range(ctx.world_size))
    tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    after = timed(lambda: dist.all_reduce(tensor, group=group))
    store_barrier("after", range(ctx.world_size))
    dist.destroy_process_group(group)
    return first, after, tensor.cpu()


def all_reduce_with_op_timeout(group, timeout_s: float) -> None:
    """all_reduce through the group's own method, with c10d's per-operation timeout (AllreduceOptions.timeout)."""
    opts = dist.AllreduceOptions()
    opts.timeout = timedelta(seconds=timeout_s)
    group.allreduce([torch.ones(4, device=ctx.device)], opts).wait()


def skip_with_op_timeout():
    """The last rank skips an all_reduce whose AllreduceOptions.timeout is TIMEOUT_S on a group whose own timeout
    is long: only the operation's timeout may fire."""
    return call_while_one_rank_skips(lambda g: all_reduce_with_op_timeout(g, TIMEOUT_S), GROUP_TIMEOUT_LONG_S,
                                     absent=ctx.world_size - 1)


def late_with_op_timeout():
    return call_with_one_rank_late(lambda g: all_reduce_with_op_timeout(g, LATE_TIMEOUT_S), GROUP_TIMEOUT_LONG_S,
                                   late=ctx.world_size - 1, late_by_s=LATE_BY_S)


PARAMS = [pytest.param(case, name, async_op, id=case, marks=pytest.mark.needs(**collectives.get(name).need()))
          for case, name, async_op in cases()]


def waiting_ranks(name: str) -> list[int] | None:
    """The ranks a collective keeps waiting for the last rank: only the root when data flows into it (rank 0),
    else (None) every other rank."""
    return [0] if collectives.get(name).flow == collectives.TO_ROOT else None


@pytest.mark.parametrize("operation, name, async_op", PARAMS)
def test_skipped_collective_raises_within_group_timeout(world, operation, name, async_op, record_property):
    """A collective one rank never enters raises on every rank waiting for it within [timeout, timeout + 5 s]."""
    expect_timeout_errors(world.run(skip_on_last_rank, name, async_op), operation, TIMEOUT_S, record_property,
                          bound=waiting_ranks(name))


@pytest.mark.min_world_size(2)  # a late rank alone waits for nobody: there is no one to wait for it
@pytest.mark.parametrize("operation, name, async_op", PARAMS)
def test_late_rank_within_group_timeout_succeeds(world, operation, name, async_op, record_property):
    """A collective one rank joins 1.5 s late on a group with a 6 s timeout succeeds everywhere; the others wait for it."""
    expect_late_rank_waited_for(world.run(last_rank_late, name, async_op), operation, LATE_BY_S, LATE_TIMEOUT_S,
                                record_property, bound=waiting_ranks(name))


@pytest.mark.min_world_size(2)
@pytest.mark.needs(feature="work_wait_timeout")
def test_wait_timeout_outlasted_by_a_late_rank_returns(world, record_property):
    """Work.wait(6 s) on an all_reduce whose last rank comes 1.5 s late returns the sum after it came, before 6 s."""
    results = world.run(wait_with_timeout_for_a_late_rank)
    n = world.world_size
    for rank, (_, tensor) in enumerate(results):
        expect_tensor(tensor, torch.full((4,), n * (n + 1) / 2), f"rank {rank}: the all_reduce output")
    expect_late_rank_waited_for([outcome for outcome, _ in results], "all_reduce + Work.wait(timeout)", LATE_BY_S,
                                LATE_TIMEOUT_S, record_property)


@pytest.mark.min_world_size(2)
def test_op_timeout_fires_when_a_rank_skips(world, record_property):
    """An all_reduce with AllreduceOptions.timeout 0.5 s that one rank skips raises on the others within [0.5 s, 5.5 s], the group's own timeout being long."""
    expect_timeout_errors(world.run(skip_with_op_timeout), "all_reduce(AllreduceOptions.timeout)", TIMEOUT_S,
                          record_property)


@pytest.mark.min_world_size(2)
def test_op_timeout_outlasted_by_a_late_rank_succeeds(world, record_property):
    """An all_reduce with AllreduceOptions.timeout 6 s whose last rank comes 1.5 s late succeeds; the others wait for it."""
    expect_late_rank_waited_for(world.run(late_with_op_timeout), "all_reduce(AllreduceOptions.timeout)", LATE_BY_S,
                                LATE_TIMEOUT_S, record_property)


def outcome_text(rank: int, outcome) -> str:
    raised, seconds, error = outcome
    return f"rank {rank} {'raised' if raised else 'returned'} after {seconds:.2f} s" + \
        (f": {error.splitlines()[0][:200]}" if raised else "")


@pytest.mark.min_world_size(2)
@pytest.mark.needs(clause="test_group_after_a_timeout_behaves_as_declared")
def test_group_after_a_timeout_behaves_as_declared(world, backend_spec, record_property):
    """After a collective timed out, the group's next collective succeeds or fails at once as the backend declares; never a hang."""
    results = world.run(next_collective_after_a_timeout)
    n = world.world_size
    for rank, (first, _, _) in enumerate(results[:-1]):
        assert first[0], f"precondition: rank {rank}'s all_reduce returned although rank {n - 1} never joined it"
    seen = "; ".join(outcome_text(rank, after) for rank, (_, after, _) in enumerate(results))
    record_property("finding", f"the next all_reduce: {seen}")
    for rank, (_, (_, seconds, _), _) in enumerate(results):
        assert seconds <= AFTER_TIMEOUT_GROUP_S + SLACK_S, \
            f"rank {rank}'s next all_reduce took {seconds:.2f} s, beyond the group's timeout + {SLACK_S:g} s: {seen}"
    declared = backend_spec.after_timeout
    succeeded = [rank for rank, (_, (raised, _, _), _) in enumerate(results) if not raised]
    if declared is None:
        assert succeeded in ([], list(range(n))), \
            f"after a timeout (no behaviour declared) the ranks disagree on the group's next all_reduce: {seen}"
    elif declared.usable:
        assert succeeded == list(range(n)), f"declared usable after a timeout, but: {seen}"
    else:
        assert not succeeded, f"declared to fail at once after a timeout, but ranks {succeeded} returned: {seen}"
        for rank, (_, (_, seconds, error), _) in enumerate(results):
            assert seconds <= AFTER_TIMEOUT_GROUP_S / 2, \
                f"rank {rank}: declared to fail at once after a timeout, raised after {seconds:.2f} s: {seen}"
            assert re.search(declared.error, error), \
                f"rank {rank}: the error does not match the declared /{declared.error}/: {error}"
    for rank in succeeded:
        expect_tensor(results[rank][2], torch.full((4,), n * (n + 1) / 2),
                      f"rank {rank}: the all_reduce after the timeout")
