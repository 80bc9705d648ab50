"""RPC stress benchmark: torch's test_stress_light_rpc and test_stress_heavy_rpc for every RPC agent, side by side.

    python -m suites.stress.rpc --agent tensorpipe,reference-pg,reference-tp --backend gloo --world-size 4

Benchmarks (as torch/testing/_internal/distributed/rpc/rpc_test.py): every
rank calls worker (rank + 1) % world_size; ``light`` is --calls (1000) RPCs of
a function returning 0, ``heavy`` is --heavy-calls (20) RPCs that scale a
100x100 tensor 99 times (suites/stress/rpc_udfs.py). Each runs in two modes:

* ``async``: one burst of rpc_async, then wait_all (torch's own test); the
  figure is the burst's time;
* ``sync``: a loop of rpc_sync, every call timed, for p50/p99 latency.

``train`` is distributed training over the agent's whole RPC training stack
(suites/stress/rpc_train.py): rank 0 a parameter server, every other rank a
trainer running --train-steps steps of forward over RPC, distributed
backward and a DistributedOptimizer step (mode ``step``; at world size 4: a
server and 3 trainers). Its record's ``calls`` are steps and ``rpcs_per_s``
(also ``steps_per_s``) is steps per second per trainer (slowest trainer);
``p50_us``/``p99_us`` are step times (worst trainer).

After --warmup synchronous calls the ranks meet at a barrier and start
together (suites/stress/rpc_bench.py). A record's ``seconds`` is the slowest
rank's timed part, ``rpcs_per_s`` = calls / seconds (RPCs per second per rank,
slowest rank), ``p50_us``/``p99_us`` the per-rank percentile of the sync
loop, max over ranks (None for async); per-rank figures are kept too. Every
answer is checked (#wrong). With --repeat N every measurement runs N times
back to back and the fastest run is the record (the other processes on the
machine make single runs noisy); every run's figures stay in ``repeats``.

With --profile the light benchmark runs again under
torch.autograd.profiler_legacy.profile on every rank, next to its unprofiled
run, and a before/after table gives the overhead (profiled / unprofiled time)
and how many events the profiler saw, the callee's (remote) ones included.

One World per (backend, world size) (fixtures/world.py); the agents are
started and stopped in turn in the same rank processes. Every distributed call
has a deadline: a hung agent or a failed call is an error row for that
(agent, benchmark, mode), the agent is stopped (or the world replaced) and the
run goes on. Agents and backends that are not usable here are listed with
their reason and skipped.

Output: per (benchmark, mode) a table of all agents with the ratio to
tensorpipe, the headline targets (PASS/MISS: benchmark figures, never
assertions), with --profile the before/after table, with --baseline FILE the
records that regressed by more than --max-regression percent (RPCs/s lower or
p50 higher), and everything in <report-dir>/stress.json; --write-baseline FILE
stores the run with the machine it ran on and the command that made it.

The modules: rpc_options.py (the command line, the plan), rpc_runner.py (the
sweep over worlds and agents), rpc_figures.py (a record from the ranks'
results), records.py (the records and their JSON), rpc_verdicts.py (targets,
regressions), rpc_tables.py (what is printed); this one puts them together.

Exit status: 0; 1 if a run failed (error, hang, dead rank), an answer was
wrong or a figure regressed; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

from suites.stress.common import backend_registry, host_info, run_until_interrupted, say
from suites.stress.records import RpcRecord
from suites.stress.rpc_figures import with_ratios
from suites.stress.rpc_options import parse_args
from suites.stress.rpc_runner import RpcBench
from suites.stress.rpc_tables import (print_headline, print_preamble, print_profile_table, print_regressions,
                                      print_tables, progress_line)
from suites.stress.rpc_verdicts import check_regressions, headline


def _config(args: argparse.Namespace) -> dict:
    return {"agents": args.agents, "backends": args.backends, "world_sizes": args.world_sizes,
            "benchmarks": args.benchmark_list, "modes": args.mode_list, "calls": args.calls,
            "heavy_calls": args.heavy_calls, "train_steps": args.train_steps, "warmup": args.warmup,
            "repeat": args.repeat, "profile": args.profile,
            "profile_benchmarks": args.profiled_list if args.profile else [],
            "deadline": args.deadline, "rpc_timeout": args.rpc_timeout,
            "num_worker_threads": args.num_worker_threads, "backend_plugins": args.backend_plugin,
            "planted": args.planted}


def write_baseline(path: str, args: argparse.Namespace, records: list[RpcRecord], host: dict) -> None:
    data = {"tool": "suites.stress.rpc",
            "command": "python -m suites.stress.rpc " + " ".join(shlex.quote(a) for a in args.argv),
            "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": host, "host_after": host_info(), "config": _config(args),
            "records": [r.to_json() for r in records]}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    say(f"# baseline written: {path}")


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    registry = backend_registry(args.backend_plugin, args.backends)
    if registry is None:
        return 2
    host = host_info()
    print_preamble(args, host)
    started = time.monotonic()
    bench = RpcBench(args)
    run_until_interrupted(bench.run, registry)
    records = with_ratios(bench.records)
    heads = headline(records, args, bench.unavailable)
    regressions: list[dict] = []
    missing: list[dict] = []
    if args.baseline_data is not None:
        regressions, missing = check_regressions(records, args.baseline_data, args.max_regression)
    wrong_total = sum(r.wrong for r in records)
    status = 1 if bench.errors or wrong_total or regressions else 0

    print_tables(records, bench.errors, args)
    print_profile_table(records)
    print_headline(heads)
    if args.baseline_data is not None:
        print_regressions(regressions, missing, args)
    say()
    for r in records:
        if r.wrong:
            say(f"# WRONG: {progress_line(r)[2:]}")
    os.makedirs(args.report_dir, exist_ok=True)
    path = os.path.join(args.report_dir, "stress.json")
    report = {
        "tool": "suites.stress.rpc",
        "command": "python -m suites.stress.rpc " + " ".join(shlex.quote(a) for a in args.argv),
        "config": _config(args),
        "host": host, "host_after": host_info(),
        "fields": ["agent", "backend", "world_size", "benchmark", "mode", "profiled", "calls",
                   "rpcs_per_s", "p50_us", "p99_us", "seconds", "x_tensorpipe", "wrong"],
        "records": [r.to_json() for r in records],
        "errors": bench.errors,
        "unavailable": bench.unavailable,
        "headline": heads,
        "baseline": args.baseline, "max_regression_pct": args.max_regression if args.baseline else None,
        "regressions": regressions, "not_in_baseline": missing,
        "wrong_total": wrong_total,
        "exit_status": status,
        "seconds": time.monotonic() - started,
    }
    with open(path, "w") as fh:
        json.dump(report, fh, indent=1)
    from reports.benchmarks import write_rpc_outputs  # CSV and plots beside the JSON
    from reports.html_report import refresh_report  # the folder's report.html, when it holds a conformance run

    written = write_rpc_outputs(report, args.report_dir) + refresh_report(args.report_dir)
    say(f"# also written: {', '.join(os.path.basename(p) for p in written)}")
    if args.write_baseline:
        write_baseline(args.write_baseline, args, records, host)
    say(f"# {len(records)} records, {len(bench.errors)} errors, {wrong_total} wrong answers, "
        f"{len(regressions)} regressions, {len(bench.unavailable)} unavailable; "
        f"{time.monotonic() - started:.1f} s; load average before {host.get('load_average')}, after "
        f"{report['host_after'].get('load_average')}; report: {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
