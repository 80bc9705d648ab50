"""Rank-side pieces of the soak workloads: checked all_reduce rounds, a checked p2p ring, async operations
in flight across groups. Each raises naming the round and the value when a result is wrong."""

from __future__ import annotations

from datetime import timedelta

import torch

from fixtures.rank import ctx
from suites.soak import groups

THREAD_DEADLINE_S = 40.0  # how long a rank waits for its threads (suites/soak/threads.py)
GROUP_TIMEOUT_S = 30.0


def fresh_groups(count: int, what: str) -> list:
    return [groups.named_group(f"soak-{what}-{ctx.case_id}-{i}", GROUP_TIMEOUT_S) for i in range(count)]


def destroy_all(live: list) -> None:
    while live:  # pop: no loop variable keeps the last group alive
        groups.destroy(live.pop())


def reduce_rounds(pg, rounds: int, salt: int) -> int:
    for i in range(rounds):
        groups.checked_all_reduce(pg, salt + i)
    return rounds


def ring_rounds(pg, rounds: int) -> int:
    """Send to the next rank and receive from the previous one, ``rounds`` times, checking each message."""
    n = ctx.world_size
    nxt, prv = (ctx.rank + 1) % n, (ctx.rank - 1) % n
    for i in range(rounds):
        out = torch.full((16,), float(ctx.rank * 1000 + i), device=ctx.device)
        got = torch.empty(16, device=ctx.device)
        # the lower rank of a pair sends first, so blocking p2p cannot wait in a circle
        works = ([pg.send([out], nxt, i), pg.recv([got], prv, i)] if ctx.rank % 2 == 0
                 else [pg.recv([got], prv, i), pg.send([out], nxt, i)])
        for work in works:
            work.wait()
        if not bool((got == float(prv * 1000 + i)).all()):
            raise AssertionError(f"round {i}: from rank {prv} got {got.tolist()[:4]}..., "
                                 f"expected {prv * 1000 + i}")
    return rounds


def many_in_flight(group_count: int, per_group: int, what: str = "flight") -> int:
    """``group_count * per_group`` async all_reduces issued before any wait, waited in reverse; checked."""
    live = fresh_groups(group_count, what)
    try:
        pending = []
        for i in range(per_group):
            for g, pg in enumerate(live):
                salt = 1 + g * per_group + i
                tensor = torch.full((64,), float((ctx.rank + 1) * salt), device=ctx.device)
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
        destroy_all(live)
