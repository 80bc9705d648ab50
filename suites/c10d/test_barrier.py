"""Contract: barrier really synchronises, and says so when a rank never comes.

Synchronisation is checked through the store, not by comparing clocks across
processes: the late rank writes a key just before entering the barrier, and
every rank must see that key right after leaving it.
"""

import time

import pytest
import torch.distributed as dist

from fixtures.rank import ctx
from suites.c10d.timeouts import SLACK_S, call_while_one_rank_skips, expect_timeout_errors

LATE_BY_S = 0.2
TIMEOUT_S = 0.5


# ---------------------------------------------------------------- rank side
def barrier_with_each_rank_late(ranks=None):
    """For every member in turn: it arrives late; everybody must see its key after the barrier."""
    group = None
    if ranks is not None:
        key = ("barrier_group", tuple(ranks))
        if key not in ctx.scratch:
            ctx.scratch[key] = dist.new_group(ranks=ranks)
        group = ctx.scratch[key]
        if ctx.rank not in ranks:
            return None
    seen = {}
    for late in (ranks or range(ctx.world_size)):
        if ctx.rank == late:
            time.sleep(LATE_BY_S)
            ctx.store.set(f"arrived/{late}", "1")
        dist.barrier(group=group)
        seen[late] = ctx.store.check([f"arrived/{late}"])
    return seen


def barrier_timeout_case():
    return call_while_one_rank_skips(lambda g: dist.barrier(group=g), TIMEOUT_S, absent=ctx.world_size - 1)


def monitored_barrier_case(wait_all_ranks):
    from datetime import timedelta

    return call_while_one_rank_skips(
        lambda g: dist.monitored_barrier(group=g, timeout=timedelta(seconds=TIMEOUT_S),
                                         wait_all_ranks=wait_all_ranks),
        TIMEOUT_S, absent=ctx.world_size - 1)


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(collective="barrier")
def test_barrier_waits_for_the_late_rank(world):
    """No rank leaves barrier() before the last rank has entered it (checked through the store)."""
    for rank, seen in enumerate(world.run(barrier_with_each_rank_late)):
        missed = [late for late, ok in seen.items() if not ok]
        assert not missed, f"rank {rank} left the barrier before late rank(s) {missed} had arrived"


@pytest.mark.needs(collective="barrier", feature="subgroups")
@pytest.mark.min_world_size(3)
def test_subgroup_barrier_waits_for_members(world):
    """barrier(group) on a subgroup waits for its late member; non-members are not involved."""
    ranks = list(range(1, world.world_size))
    for rank, seen in enumerate(world.run(barrier_with_each_rank_late, ranks)):
        if rank not in ranks:
            assert seen is None
            continue
        missed = [late for late, ok in seen.items() if not ok]
        assert not missed, f"rank {rank} left the subgroup barrier before member(s) {missed} had arrived"


@pytest.mark.needs(collective="barrier", feature="barrier_timeout")
def test_barrier_skipped_by_one_rank_times_out(world, record_property):
    """A barrier one rank never enters raises on the others within [timeout, timeout + 5 s]."""
    expect_timeout_errors(world.run(barrier_timeout_case), "barrier", TIMEOUT_S, record_property)


@pytest.mark.min_world_size(2)  # a rank that never arrives: one besides rank 0
@pytest.mark.needs(feature="monitored_barrier")
@pytest.mark.parametrize("wait_all_ranks", [False, True], ids=["first_missing", "all_missing"])
def test_monitored_barrier_names_the_missing_rank(world, wait_all_ranks, record_property):
    """monitored_barrier on rank 0 raises within its timeout naming the rank that never arrived."""
    results = world.run(monitored_barrier_case, wait_all_ranks)
    raised, seconds, error = results[0]
    absent = world.world_size - 1
    assert raised, "monitored_barrier on rank 0 returned although a rank never arrived"
    assert str(absent) in error and "monitoredBarrier" in error or f"Ranks {absent}" in error, \
        f"rank 0's error does not name missing rank {absent}: {error}"
    assert seconds <= TIMEOUT_S + SLACK_S, f"monitored_barrier took {seconds:.2f} s"
    record_property("finding", error.splitlines()[0])
