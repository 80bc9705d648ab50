"""Contract: groups created and destroyed again and again, from several threads at once, leave nothing behind.

Each rank runs THREADS threads at once; each thread creates a group over the whole world (named by thread
and cycle, so the ranks pair the same groups whatever the interleaving), checks one all_reduce on it and
destroys it, CYCLES times, as MPICH's threaded communicator tests dup and free communicators. Afterwards,
once Python has collected the groups, every rank holds no more descriptors, threads, listening ports or
/dev/shm entries than before the first cycle (read after a warm-up cycle, so process-wide pools do not
count). Each thread has its own store client; a second clause creates two groups from two threads over
one shared client, in opposite orders on neighbouring ranks, as threads sharing the default store do.
Every wait has a deadline: a thread still creating or reducing after it fails the case with its
stack instead of hanging the run. The soak marker runs hundreds of cycles per thread.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch.distributed as dist

from fixtures.rank import ctx
from suites.soak import groups
from suites.soak.resources import leftovers, settle
from suites.soak.threads import run_threads

THREADS = 3
CYCLES = 8  # per thread: a few dozen groups per default run
SOAK_THREADS = 4
SOAK_CYCLES = 250  # per thread: a thousand groups
GROUP_TIMEOUT_S = 30.0
SETTLE_S = 5.0
CROSSED_DELAY_S = 0.3  # the second thread starts this much later: the first one's wait is under way
CROSSED_TIMEOUT_S = 2.0  # a group's rendezvous timeout in the crossed clause


def _cycles(thread: int, cycles: int) -> int:
    # a store client per thread: gloo's construction blocks reading the store, and on a shared client that
    # read holds the client against the other threads' writes (test_groups_created_in_crossed_order)
    store = ctx.store.clone()
    for cycle in range(cycles):
        pg = groups.named_group(f"soak-churn-{ctx.case_id}-t{thread}-c{cycle}", GROUP_TIMEOUT_S, store)
        groups.checked_all_reduce(pg, cycle + 1)
        groups.destroy(pg)
        del pg  # the next cycle's reading must not see this group alive
    return cycles


def churn(threads: int, cycles: int, deadline_s: float):
    """(leftovers, before, after) of ``threads`` x ``cycles`` create/use/destroy cycles, threads at once."""
    _cycles(-1, 1)  # warm-up: process-wide pools are not a group's leftovers
    dist.barrier()
    before = settle(None, SETTLE_S)
    done = run_threads({f"t{t}": functools.partial(_cycles, t, cycles) for t in range(threads)}, deadline_s)
    dist.barrier()  # nobody measures while a peer still tears a group down
    after = settle(before, SETTLE_S)
    return leftovers(before, after), sum(done.values()), before.as_dict(), after.as_dict()


def crossed_creation(delay_s: float, timeout_s: float) -> dict:
    """Two threads create groups A and B at once over the case's one store client; even ranks start A
    first, odd ranks B first, so each rank's first group waits for a peer busy with the other one."""
    first, second = ("A", "B") if ctx.rank % 2 == 0 else ("B", "A")

    def make(name: str, delay: float) -> str:
        time.sleep(delay)
        pg = groups.named_group(f"soak-crossed-{ctx.case_id}-{name}", timeout_s)
        groups.checked_all_reduce(pg, 1)
        groups.destroy(pg)
        return "created"

    return run_threads({first: functools.partial(make, first, 0.0),
                        second: functools.partial(make, second, delay_s)}, 2 * timeout_s + delay_s)


def check_nothing_left(results, expected_cycles: int) -> None:
    for rank, (left, done, before, after) in enumerate(results):
        assert done == expected_cycles, f"rank {rank}: {done} of {expected_cycles} cycles done"
        assert not left, (f"rank {rank}: after {expected_cycles} groups were created and destroyed from "
                          f"several threads it holds more than before (before, after): {left}; "
                          f"before {before}, after {after}")


pytestmark = pytest.mark.needs(feature="subgroups")


@pytest.mark.deadline(150)
def test_threaded_create_destroy_leaves_nothing(world):
    """Groups created and destroyed from several threads at once leave no fd, thread, port or shm entry behind."""
    check_nothing_left(world.run(churn, THREADS, CYCLES, 120.0), THREADS * CYCLES)


@pytest.mark.needs(feature="concurrent_group_creation")
@pytest.mark.deadline(60)
def test_groups_created_in_crossed_order_from_two_threads(world):
    """Two threads creating two groups at once, in opposite orders on neighbouring ranks, both finish."""
    for rank, done in enumerate(world.run(crossed_creation, CROSSED_DELAY_S, CROSSED_TIMEOUT_S)):
        assert done == {"A": "created", "B": "created"}, f"rank {rank}: {done}"


@pytest.mark.soak
@pytest.mark.deadline(600)
def test_threaded_create_destroy_soak(world, record_property):
    """A thousand groups created and destroyed from four threads at once leave nothing behind."""
    results = world.run(churn, SOAK_THREADS, SOAK_CYCLES, 560.0)
    check_nothing_left(results, SOAK_THREADS * SOAK_CYCLES)
    record_property("finding", f"{SOAK_THREADS} threads x {SOAK_CYCLES} create/destroy cycles; rank 0 before "
                               f"{results[0][2]}, after {results[0][3]}")
