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
"""

import pytest

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
    issue_small,
    store_barrier,
)
from suites.checks import expect_tensor

pytestmark = pytest.mark.needs(feature="group_timeout")

TIMEOUT_S = 0.5
# The negative twins: a rank this late against a timeout this long has seconds of slack on a loaded machine,
# and a backend that cuts the timeout to under LATE_BY_S fails.
LATE_TIMEOUT_S = 6.0
LATE_BY_S = 1.5


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
    start = time.perf_counter()
    try:
        dist.all_reduce(tensor, group=group, async_op=True).wait(timeout=timedelta(seconds=LATE_TIMEOUT_S))
        outcome = (False, time.perf_counter() - start, "")
    except Exception as exc:  # the finding: the backend's own error text
        outcome = (True, time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
    store_barrier("finished", range(ctx.world_size))
    dist.destroy_process_group(group)
    return outcome, tensor.cpu()


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
