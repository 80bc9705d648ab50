"""Contract: a mixed workload run for minutes stays exact and does not drift in descriptors, threads or memory.

Under the soak marker the controller runs rounds of a mixed workload until ``--soak-minutes`` have passed:
each round creates two groups, all_reduces on one from one thread while a second thread sends around a
ring on the other, issues a batch of async all_reduces across both and a broadcast on the default group,
checks every result and destroys the groups. A progress line shows rounds and time; at the end the
resource table (start and end of the run, per rank) goes to the report, and drift in descriptors, threads
or RSS is a finding. Every round has the world's deadline.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.soak import groups
from suites.soak.resources import holding, settle
from suites.soak.threads import run_threads
from suites.soak.workload import (
    THREAD_DEADLINE_S,
    destroy_all,
    many_in_flight,
    reduce_rounds,
    ring_rounds,
)

ROUNDS_PER_CALL = 5
OPS_PER_ROUND = 4
SETTLE_S = 5.0


def mixed_rounds(first_round: int, rounds: int) -> int:
    """``rounds`` rounds of the mixed workload; returns the rounds done (each result checked on the way)."""
    for r in range(first_round, first_round + rounds):
        live = [groups.named_group(f"soak-long-{ctx.case_id}-{r}-{i}", 30) for i in range(2)]
        run_threads({"all_reduce": functools.partial(reduce_rounds, live[0], OPS_PER_ROUND, r + 1),
                     "send_recv": functools.partial(ring_rounds, live[1], OPS_PER_ROUND)}, THREAD_DEADLINE_S)
        destroy_all(live)
        many_in_flight(2, OPS_PER_ROUND, f"long-flight-{r}")
        tensor = torch.full((1024,), float(r if ctx.rank == 0 else -1), device=ctx.device)
        dist.broadcast(tensor, 0)
        if not bool((tensor == float(r)).all()):
            raise AssertionError(f"round {r}: broadcast gave {tensor[:4].tolist()}..., expected {r}")
    return rounds


def reading(wait_to_settle: bool) -> dict:
    dist.barrier()
    return (settle(None, SETTLE_S) if wait_to_settle else holding()).as_dict()


@pytest.mark.soak
@pytest.mark.needs(feature="concurrent_groups", collective="send_recv")
@pytest.mark.deadline(120)
def test_mixed_workload_for_minutes(world, request, record_property, capsys):
    """A mixed multi-group workload run for --soak-minutes stays exact; drift in fds, threads, RSS is reported."""
    minutes = request.config.getoption("soak_minutes")
    world.run(mixed_rounds, 0, 1)  # warm-up: process-wide pools are not drift
    start = world.run(reading, True)
    began = time.monotonic()
    done = 0
    while time.monotonic() - began < minutes * 60:
        done += world.run(mixed_rounds, 1 + done, ROUNDS_PER_CALL)[0]
        with capsys.disabled():
            print(f"\rsoak {world.name}: "
                  f"{done} rounds, {time.monotonic() - began:.0f} of {minutes * 60:.0f} s", end="", flush=True)
    end = world.run(reading, True)
    with capsys.disabled():
        print()
    rows = [f"rank {rank}: " + ", ".join(f"{k} {a[k]}->{b[k]}" for k in a) for rank, (a, b) in
            enumerate(zip(start, end))]
    drift = {k: max(b[k] - a[k] for a, b in zip(start, end)) for k in ("fds", "threads", "rss_kib")}
    drifted = {k: v for k, v in drift.items() if v > 0}
    record_property("finding", f"{done} rounds in {time.monotonic() - began:.0f} s; "
                               f"{'drift ' + str(drifted) if drifted else 'no drift in fds or threads or RSS'}; "
                               + "; ".join(rows))
