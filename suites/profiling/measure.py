"""Measure TensorPipe's profiles: which events of each workload vary between profiles, and why the rule holds.

    python -m suites.profiling.measure [--samples 40] [--world-size 2,3] [--busy 2] [--out FILE]
    python -m suites.profiling.measure --thread-reuse 4 [--busy 2]

Takes ``--samples`` legacy profiles of every workload and mode on TensorPipe
(rank 0 calls, as the parity clauses do), optionally beside ``--busy``
processes spinning on a core each, and prints, per event that is not in
every profile with the same count, how often it appeared and whether
suites/profiling/parity.py's rule classifies it (transport work left out,
a callee group lost whole, or in part by a racing call) or holds it exact.
An exact event that varied is a measurement the rule does not cover: the
command exits 1 and says which. The numbers in parity.py's docstring and
docs/rpc.md come from it.

``--thread-reuse N`` measures rule 2's first cause: TensorPipe with N worker
threads, 3N profiled calls one after another, and per call whether the
thread that served it had served one before and whether its events came
back. It exits 1 if a call served by a fresh thread came back empty (the
rule's premise would not hold).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter

from backends.registry import BackendRegistry
from fixtures.world import World
from suites.profiling import capture, parity
from suites.profiling.workloads import MODES, WORKLOADS
from suites.rpc.call_modes import exec_mode_of


def sample_world(world_size: int, samples: int) -> dict[tuple[str, str], list[list[dict]]]:
    """Every workload and call mode's ``samples`` profiles (raw events) in a fresh gloo world running TensorPipe."""
    world = World(BackendRegistry(()).get("gloo"), world_size, ("cpu",) * world_size).start()
    init_dir = capture.new_init_dir()
    out: dict[tuple[str, str], list[list[dict]]] = {}
    try:
        world.run(capture.start_tensorpipe, init_dir, 1024)
        for name, work in WORKLOADS.items():
            if work.min_world_size > world_size:
                continue
            for rpc_call in MODES:
                world.run(capture.profile_workload, "tensorpipe", name, rpc_call, warmup=1)
                out[name, rpc_call] = [world.run(capture.profile_workload, "tensorpipe", name, rpc_call)[0]["events"]
                                       for _ in range(samples)]
        world.run(capture.stop_tensorpipe)
    finally:
        world.close()
    return out


def classify(workload: str, rpc_call: str, key: tuple, profiles: list[Counter]) -> str:
    if parity.is_transport(key):
        return "transport work (rule 1: left out)"
    if parity.is_callee_event(key):
        if WORKLOADS[workload].races(rpc_call):
            return "racing callee group (rule 2)"
        request = parity.request_of(key)
        delivered = {p[key] for p in profiles if request in parity.callee_groups(p)}
        if len(delivered) == 1:
            return "callee group lost whole (rule 2)"
    return "EXACT (rule 3) yet it varied"


def thread_reuse(threads: int, calls: int) -> int:
    """Rule 2's first cause, measured: exit status 1 if a call served by a fresh thread lost its events."""
    world = World(BackendRegistry(()).get("gloo"), 2, ("cpu",) * 2).start()
    init_dir = capture.new_init_dir()
    try:
        world.run(capture.start_tensorpipe, init_dir, threads)
        rows = world.run(capture.profile_thread_reuse, "tensorpipe", calls)[0]
        world.run(capture.stop_tensorpipe)
    finally:
        world.close()
    table = Counter((row["reused"], row["callee_events"] > 0) for row in rows)
    for reused in (False, True):
        print(f"served by a {'reused' if reused else 'fresh'} thread: {table[reused, True]} brought their events, "
              f"{table[reused, False]} came back empty")
    print(f"{calls} profiled calls, {threads} worker threads")
    return 1 if table[False, False] else 0


def varying(profiles: list[list[dict]]) -> dict[tuple, Counter]:
    """Per event key that is not in every profile with one count: how many profiles had each count."""
    counts = [Counter(map(parity.event_key, events)) for events in profiles]
    return {key: Counter(c[key] for c in counts) for key in sorted(set().union(*counts))
            if len({c[key] for c in counts}) > 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--world-size", default="2,3")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core each while sampling")
    parser.add_argument("--out", help="write every varying event as JSON here")
    parser.add_argument("--thread-reuse", type=int, metavar="THREADS",
                        help="measure rule 2's worker-thread reuse with this many TensorPipe threads instead")
    args = parser.parse_args(argv)
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.busy)]
    if args.thread_reuse:
        try:
            return thread_reuse(args.thread_reuse, 3 * args.thread_reuse)
        finally:
            for proc in busy:
                proc.kill()
    uncovered, report = 0, []
    try:
        for world_size in (int(w) for w in args.world_size.split(",")):
            for (workload, rpc_call), profiles in sample_world(world_size, args.samples).items():
                mode = exec_mode_of(rpc_call)  # as the parity table names it
                counted = [parity.multiset(events) for events in profiles]
                for key, seen in varying(profiles).items():
                    verdict = classify(workload, rpc_call, key, counted)
                    uncovered += verdict.startswith("EXACT")
                    report.append({"world_size": world_size, "workload": workload, "mode": mode, "event": key[0],
                                   "node": key[1], "shapes": key[2], "profiles_by_count": dict(seen),
                                   "rule": verdict})
                    print(f"ws{world_size} {workload} {mode}: {key[0]!r} node {key[1]} shapes {key[2]}: "
                          f"{dict(sorted(seen.items()))} of {args.samples} profiles -> {verdict}")
    finally:
        for proc in busy:
            proc.kill()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{len(report)} varying events, {uncovered} not covered by the rule "
          f"({args.samples} profiles per workload and mode, {args.busy} busy processes)")
    return 1 if uncovered else 0


if __name__ == "__main__":
    sys.exit(main())
