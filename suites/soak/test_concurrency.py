"""Contract: operations on separate groups from separate threads run at once, exactly, within a deadline.

* one thread all_reduces on one group while another thread sends and receives around a ring on a
  second group, at the same time, many rounds (PyTorch #175145 reports gloo deadlocking here);
* several threads, each with its own group, all_reduce at once;
* many asynchronous all_reduces in flight across several groups before any is waited, waited in
  reverse order.

Every result is checked element by element; every wait has a deadline, so a deadlock fails the case with
the stuck threads' stacks instead of hanging the run.
"""

from __future__ import annotations

import functools

import pytest

from suites.soak.threads import run_threads
from suites.soak.workload import (
    THREAD_DEADLINE_S,
    destroy_all,
    fresh_groups,
    many_in_flight,
    reduce_rounds,
    ring_rounds,
)

ROUNDS = 20
GROUPS_IN_FLIGHT = 4
OPS_PER_GROUP = 8


def reduce_and_p2p_at_once(rounds: int) -> dict:
    live = fresh_groups(2, "mixed")
    done = run_threads({"all_reduce": functools.partial(reduce_rounds, live[0], rounds, 1),
                        "send_recv": functools.partial(ring_rounds, live[1], rounds)}, THREAD_DEADLINE_S)
    destroy_all(live)  # not after ThreadsStuck: a stuck thread may hold what destroying waits for
    return done


def reduces_on_own_groups(threads: int, rounds: int) -> dict:
    live = fresh_groups(threads, "own")
    done = run_threads({f"t{t}": functools.partial(reduce_rounds, live[t], rounds, 10 * t)
                        for t in range(threads)}, THREAD_DEADLINE_S)
    destroy_all(live)
    return done


pytestmark = pytest.mark.needs(feature="subgroups", collective="all_reduce")


@pytest.mark.min_world_size(2)  # the p2p ring needs a peer: a ring of one is a send to the own rank
@pytest.mark.needs(feature="concurrent_groups", collective="send_recv")
@pytest.mark.deadline(60)
def test_all_reduce_and_p2p_on_separate_groups_at_once(world):
    """all_reduce on one group and send/recv on another, from two threads at once, are exact and finish."""
    for rank, done in enumerate(world.run(reduce_and_p2p_at_once, ROUNDS)):
        assert done == {"all_reduce": ROUNDS, "send_recv": ROUNDS}, f"rank {rank}: {done}"


@pytest.mark.needs(feature="concurrent_groups")
@pytest.mark.deadline(60)
def test_all_reduces_on_own_groups_from_threads(world):
    """Three threads, each all_reducing on its own group at once, all get exact sums and finish."""
    for rank, done in enumerate(world.run(reduces_on_own_groups, 3, ROUNDS)):
        assert done == {f"t{t}": ROUNDS for t in range(3)}, f"rank {rank}: {done}"


@pytest.mark.needs(feature="async_work")
@pytest.mark.deadline(60)
def test_many_async_all_reduces_in_flight_across_groups(world):
    """Dozens of async all_reduces in flight on several groups, waited in reverse order, are all exact."""
    for rank, done in enumerate(world.run(many_in_flight, GROUPS_IN_FLIGHT, OPS_PER_GROUP)):
        assert done == GROUPS_IN_FLIGHT * OPS_PER_GROUP, f"rank {rank}: {done} operations"
