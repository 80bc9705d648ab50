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
from datetime import timedelta

import pytest
import torch

from fixtures.rank import ctx
from suites.soak import groups
from suites.soak.threads import run_threads

ROUNDS = 20
THREAD_DEADLINE_S = 40.0
GROUP_TIMEOUT_S = 30.0
GROUPS_IN_FLIGHT = 4
OPS_PER_GROUP = 8


def _reduce_rounds(pg, rounds: int, salt: int) -> int:
    for i in range(rounds):
        groups.checked_all_reduce(pg, salt + i)
    return rounds


def _ring_rounds(pg, rounds: int) -> int:
    """Send to the next rank and receive from the previous one, ``rounds`` times, checking each message."""
    n = ctx.world_size
    nxt, prv = (ctx.rank + 1) % n, (ctx.rank - 1) % n
    for i in range(rounds):
        out = torch.full((16,), float(ctx.rank * 1000 + i))
        got = torch.empty(16)
        # the lower rank of a pair sends first, so blocking p2p cannot wait in a circle
        works = ([pg.send([out], nxt, i), pg.recv([got], prv, i)] if ctx.rank % 2 == 0
                 else [pg.recv([got], prv, i), pg.send([out], nxt, i)])
        for work in works:
            work.wait()
        if not bool((got == float(prv * 1000 + i)).all()):
            raise AssertionError(f"round {i}: from rank {prv} got {got.tolist()[:4]}..., "
                                 f"expected {prv * 1000 + i}")
    return rounds


def _fresh_groups(count: int, what: str) -> list:
    return [groups.named_group(f"soak-{what}-{ctx.case_id}-{i}", GROUP_TIMEOUT_S) for i in range(count)]


def _destroy_all(live: list) -> None:
    while live:
        groups.destroy(live.pop())


def reduce_and_p2p_at_once(rounds: int) -> dict:
    live = _fresh_groups(2, "mixed")
    done = run_threads({"all_reduce": functools.partial(_reduce_rounds, live[0], rounds, 1),
                        "send_recv": functools.partial(_ring_rounds, live[1], rounds)}, THREAD_DEADLINE_S)
    _destroy_all(live)  # not after ThreadsStuck: a stuck thread may hold what destroying waits for
    return done


def reduces_on_own_groups(threads: int, rounds: int) -> dict:
    live = _fresh_groups(threads, "own")
    done = run_threads({f"t{t}": functools.partial(_reduce_rounds, live[t], rounds, 10 * t)
                        for t in range(threads)}, THREAD_DEADLINE_S)
    _destroy_all(live)
    return done


def many_in_flight(group_count: int, per_group: int) -> int:
    """``group_count * per_group`` async all_reduces issued before any wait, waited in reverse; checked."""
    live = _fresh_groups(group_count, "flight")
    try:
        pending = []
        for i in range(per_group):
            for g, pg in enumerate(live):
                salt = 1 + g * per_group + i
                tensor = torch.full((64,), float((ctx.rank + 1) * salt))
                pending.append((pg.allreduce([tensor]), tensor, salt))
        n = ctx.world_size
        for work, tensor, salt in reversed(pending):
            if not work.wait(timedelta(seconds=THREAD_DEADLINE_S)):
                raise TimeoutError(f"all_reduce salt {salt} did not complete within {THREAD_DEADLINE_S} s")
            expected = float(salt * n * (n + 1) // 2)
            if not bool((tensor == expected).all()):
                raise AssertionError(f"async all_reduce salt {salt}: got {tensor.tolist()[:4]}..., "
                                     f"expected {expected}")
        return len(pending)
    finally:
        _destroy_all(live)


pytestmark = pytest.mark.needs(feature="subgroups", collective="all_reduce")


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
