"""Contract: a live process group costs each rank a bounded, measured number of descriptors and threads.

Each rank creates groups over the whole world one by one (each used by one all_reduce, so lazily opened
connections count) and reads /proc after each step: descriptors, OS threads, listening TCP ports owned by
its sockets, /dev/shm entries and the resident set. The cost of one group is the growth divided by the
number of live groups (the largest over the ranks); with it the report shows how many groups a process
limited to 1024 descriptors can hold. The table goes to the report as a finding and, row per reading, to
``<report-dir>/soak_resources.csv``. A backend that declares a ``resource_budget`` (backends/spec.py)
fails where one group costs more descriptors or threads than it allows.
"""

from __future__ import annotations

import csv
import os

import pytest
import torch.distributed as dist

from fixtures.rank import ctx
from reports.collector import report_dir
from suites.soak import groups
from suites.soak.resources import holding, leftovers, settle

LIVE_GROUPS = (0, 2, 4, 8)  # the readings; the cost per group comes from the last
FD_LIMIT = 1024  # a common default `ulimit -n`
SETTLE_S = 5.0
CSV_NAME = "soak_resources.csv"
CSV_FIELDS = ("backend", "world_size", "rank", "live_groups", "fds", "threads", "listening_ports",
              "shm_entries", "rss_kib")


def readings_with_live_groups(counts: tuple[int, ...]) -> list[tuple[int, dict]]:
    """(live groups, holding) at each count in ``counts``; every group destroyed afterwards."""
    warm = groups.named_group(f"soak-res-{ctx.case_id}-warm", 30)  # process-wide pools are not a group's cost
    groups.checked_all_reduce(warm, 1)
    groups.destroy(warm)
    del warm
    dist.barrier()
    before = settle(None, SETTLE_S)
    live, readings = [], []
    for count in counts:
        while len(live) < count:
            pg = groups.named_group(f"soak-res-{ctx.case_id}-{len(live)}", 30)
            groups.checked_all_reduce(pg, len(live) + 1)
            live.append(pg)
            del pg  # only ``live`` holds the groups: a group is freed when Python collects it
        dist.barrier()
        readings.append((count, (before if count == 0 else holding()).as_dict()))
    dist.barrier()  # nobody destroys a group another rank is still measuring
    while live:  # no loop variable may keep the last group alive
        groups.destroy(live.pop())
    after = settle(before, SETTLE_S)
    return readings + [(-1, after.as_dict())] + [(-2, leftovers(before, after))]


def per_group(readings: list[tuple[int, dict]], what: str) -> float:
    (_, first), (count, last) = readings[0], readings[-1]
    return (last[what] - first[what]) / count


def write_csv(config, backend: str, world_size: int, results) -> str:
    path = os.path.join(report_dir(config), CSV_NAME)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fresh = not os.path.exists(path)
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, CSV_FIELDS)
        if fresh:
            writer.writeheader()
        for rank, result in enumerate(results):
            for count, reading in result[:-2]:
                writer.writerow({"backend": backend, "world_size": world_size, "rank": rank,
                                 "live_groups": count, **reading})
    return path


@pytest.mark.needs(feature="subgroups")
def test_resources_per_live_group(world, backend_spec, request, record_property):
    """Each live group costs a measured number of fds, threads, ports and shm entries, within the declared budget."""
    results = world.run(readings_with_live_groups, LIVE_GROUPS)
    path = write_csv(request.config, backend_spec.name, world.world_size, results)
    measured = [r[:-2] for r in results]
    cost = {what: max(per_group(r, what) for r in measured)
            for what in ("fds", "threads", "listening_ports", "shm_entries", "rss_kib")}
    base_fds = max(r[0][1]["fds"] for r in measured)
    limit = int((FD_LIMIT - base_fds) // cost["fds"]) if cost["fds"] > 0 else None
    table = " | ".join(f"{count} groups: " + ", ".join(
        f"{k} {v}" for k, v in reading.items()) for count, reading in measured[0])
    record_property("finding", (
        f"{backend_spec.name} ws{world.world_size}, per live group per rank: {cost['fds']:.1f} fds, "
        f"{cost['threads']:.1f} threads, {cost['listening_ports']:.1f} listening ports, "
        f"{cost['shm_entries']:.1f} /dev/shm entries, {cost['rss_kib']:.0f} KiB RSS; a 1024-descriptor process "
        f"holds {'no limit from fds' if limit is None else f'about {limit} groups'} "
        f"(baseline {base_fds} fds). Rank 0: {table}. CSV: {path}"))
    for rank, result in enumerate(results):
        left = result[-1][1]
        assert not left, f"rank {rank}: after every group was destroyed it holds more than before: {left}"
    budget = backend_spec.resource_budget
    if budget is None:
        return
    n = world.world_size
    assert cost["fds"] <= budget.fds(n), (
        f"one group costs {cost['fds']:.1f} descriptors per rank at world size {n}, over the declared budget "
        f"of {budget.fds(n)} (backends: resource_budget {budget})")
    assert cost["threads"] <= budget.threads(n), (
        f"one group costs {cost['threads']:.1f} threads per rank at world size {n}, over the declared budget "
        f"of {budget.threads(n)} (backends: resource_budget {budget})")
