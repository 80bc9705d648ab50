"""The RPC stress benchmark's command line: its options, checked once, and the plan they make.

Everything after parse_args takes the checked ``args`` (agents, backends, world sizes, benchmarks and
modes as lists; the baseline already read), so a bad option is a usage error (exit 2) before any
process starts.
"""

from __future__ import annotations

import argparse
import sys

from backends import rpc_agents
from suites.rpc.call_modes import RPC_ASYNC, RPC_SYNC
from suites.stress.common import csv_list
from suites.stress.records import Baseline, RecordError, read_baseline

BENCHMARKS = ("light", "heavy", "train")
# the light and heavy benchmarks' modes, named by torch's exec mode (suites/rpc/call_modes.py): async, a burst of
# rpc_async then wait for all; sync, a loop of rpc_sync, every call timed (suites/stress/rpc_bench.py)
MODES = (RPC_ASYNC.exec_mode, RPC_SYNC.exec_mode)
TRAIN_MODE = "step"  # the train benchmark's one mode: a loop of timed training steps
PROFILABLE = ("light", "heavy")
PROFILED_BENCHMARKS = ("light",)  # issue 5: the light benchmark under the legacy profiler (the default)
DEFAULT_AGENTS = ("tensorpipe", "reference-pg", "reference-tp")
PLANTABLE = ("stall", "wrong")  # rpc_udfs functions the --plant test hook can put in place of light()


class UsageError(Exception):
    pass


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m suites.stress.rpc",
        description="RPC stress benchmark (torch's test_stress_light_rpc / heavy_rpc) over RPC agents.")
    parser.add_argument("--agent", default=",".join(DEFAULT_AGENTS),
                        help=f"comma-separated RPC agents, from {', '.join(rpc_agents.AGENTS)} (default: all)")
    parser.add_argument("--backend", default="gloo",
                        help="comma-separated c10d backends of the worlds (reference-pg sends over it) (default: gloo)")
    parser.add_argument("--world-size", default="4", help="comma-separated world sizes (default: 4, torch's test)")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS), help="light, heavy, train (default: all)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="async (burst + wait_all), sync (loop) for light and heavy (default: both); "
                             "train always runs its one mode, step")
    parser.add_argument("--calls", type=int, default=1000, help="RPCs per rank of the light benchmark (default: 1000)")
    parser.add_argument("--heavy-calls", type=int, default=20, help="RPCs per rank of the heavy benchmark (default: 20)")
    parser.add_argument("--train-steps", type=int, default=200,
                        help="timed steps per trainer of the train benchmark (default: 200)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed sync RPCs per rank before each run (default: 50)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every measurement N times and keep the fastest (less noise) (default: 1)")
    parser.add_argument("--profile", action="store_true",
                        help="also run the light benchmark under torch.autograd.profiler_legacy.profile")
    parser.add_argument("--profile-benchmarks", default=",".join(PROFILED_BENCHMARKS), metavar="NAMES",
                        help=f"with --profile: which benchmarks run profiled too (default: {','.join(PROFILED_BENCHMARKS)})")
    parser.add_argument("--report-dir", default="reports/out", help="where stress.json goes (default: reports/out)")
    parser.add_argument("--baseline", metavar="FILE", help="compare with this baseline (or an earlier stress.json)")
    parser.add_argument("--max-regression", type=float, default=20.0, metavar="PCT",
                        help="with --baseline: fail when RPCs/s drops or p50 rises by more than PCT%% (default: 20)")
    parser.add_argument("--write-baseline", metavar="FILE", help="store this run as a baseline")
    parser.add_argument("--backend-plugin", action="append", default=[], metavar="MODULE",
                        help="module that registers a backend (repeatable), imported here and in every rank")
    parser.add_argument("--deadline", type=float, default=60.0,
                        help="seconds one distributed call (agent start, one measurement, stop) may take (default: 60)")
    parser.add_argument("--rpc-timeout", type=float, default=60.0, help="the agents' RPC timeout in s (default: 60)")
    parser.add_argument("--num-worker-threads", type=int, default=16, help="agent worker threads (default: 16)")
    parser.add_argument("--plant", metavar="AGENT:FAULT", action="append", default=[],
                        help="test hook (repeatable): AGENT's light calls run a planted fault, FAULT one of "
                             f"{', '.join(PLANTABLE)}: stall never answers (a hung agent must become an error row), "
                             "wrong answers 1 instead of 0 (must be counted as wrong)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_args(args)
    except UsageError as exc:
        parser.error(str(exc))
    return args


def _subset(option: str, text: str, known) -> list[str]:
    chosen = csv_list(text)
    unknown = [x for x in chosen if x not in known]
    if unknown or not chosen:
        raise UsageError(f"{option}: unknown {', '.join(map(repr, unknown)) or '(none given)'}; known: {', '.join(known)}")
    return list(dict.fromkeys(chosen))


def _check_args(args) -> None:
    args.agents = _subset("--agent", args.agent, list(rpc_agents.AGENTS))
    args.backends = csv_list(args.backend)
    if not args.backends:
        raise UsageError("--backend: no backend given")
    try:
        args.world_sizes = sorted({int(x) for x in csv_list(args.world_size)})
    except ValueError:
        raise UsageError(f"--world-size: {args.world_size!r} is not a list of integers (expected e.g. 4)") from None
    if not args.world_sizes or min(args.world_sizes) < 2:
        raise UsageError("--world-size: need world sizes >= 2 (every rank calls the next one)")
    args.benchmark_list = _subset("--benchmarks", args.benchmarks, BENCHMARKS)
    args.mode_list = _subset("--modes", args.modes, MODES)
    args.profiled_list = _subset("--profile-benchmarks", args.profile_benchmarks, PROFILABLE)
    if min(args.calls, args.heavy_calls, args.train_steps, args.repeat) < 1 or args.warmup < 0:
        raise UsageError("--calls, --heavy-calls, --train-steps and --repeat must be >= 1, --warmup >= 0")
    if args.num_worker_threads < 1 or args.deadline <= 0 or args.rpc_timeout <= 0:
        raise UsageError("--num-worker-threads must be >= 1, --deadline and --rpc-timeout > 0 (seconds)")
    if args.max_regression < 0:
        raise UsageError("--max-regression must be >= 0 (a percentage)")
    args.planted = {}
    for item in args.plant:
        agent, _, fault = item.partition(":")
        if agent not in rpc_agents.AGENTS or fault not in PLANTABLE:
            raise UsageError(f"--plant: {item!r} is not AGENT:FAULT with AGENT one of {', '.join(rpc_agents.AGENTS)} "
                             f"and FAULT one of {', '.join(PLANTABLE)}")
        args.planted[agent] = fault
    args.baseline_data = load_baseline(args.baseline) if args.baseline else None


def load_baseline(path: str) -> Baseline:
    """A baseline written by --write-baseline, or any stress.json of this tool."""
    try:
        return read_baseline(path)
    except RecordError as exc:
        raise UsageError(f"--baseline: {exc}") from None


def plan(args) -> list[tuple[str, str, bool]]:
    """(benchmark, mode, profiled) in run order; a profiled run right after its unprofiled twin."""
    steps = []
    for benchmark in args.benchmark_list:
        if benchmark == "train":
            steps.append((benchmark, TRAIN_MODE, False))
            continue
        for mode in args.mode_list:
            steps.append((benchmark, mode, False))
            if args.profile and benchmark in args.profiled_list:
                steps.append((benchmark, mode, True))
    return steps


def calls_of(args, benchmark: str) -> int:
    return {"light": args.calls, "heavy": args.heavy_calls, "train": args.train_steps}[benchmark]
