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

Exit status: 0; 1 if a run failed (error, hang, dead rank), an answer was
wrong or a figure regressed; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass

from backends import rpc_agents
from suites.stress import metrics
from suites.stress.common import (WorldSlot, backend_registry, csv_list, device_plan, host_info,
                                  run_until_interrupted, say)
from suites.stress.progress import Progress

BENCHMARKS = ("light", "heavy", "train")
MODES = ("async", "sync")
TRAIN_MODE = "step"  # the train benchmark's one mode: a loop of timed training steps
PROFILABLE = ("light", "heavy")
IMPORT_DEADLINE_S = 180.0  # importing a training stack (torch.distributed.optim) is slow on a loaded machine
PROFILED_BENCHMARKS = ("light",)  # issue 5: the light benchmark under the legacy profiler (the default)
DEFAULT_AGENTS = ("tensorpipe", "reference-pg", "reference-tp")
BASE_AGENT = "tensorpipe"  # what the others are compared with
PLANTABLE = ("stall", "wrong")  # rpc_udfs functions the --plant test hook can put in place of light()
KEY_FIELDS = ("agent", "backend", "world_size", "benchmark", "mode", "profiled")


@dataclass(frozen=True)
class Target:
    """A headline figure: ``agent``'s ``metric`` against a bound (relative: x tensorpipe's)."""

    agent: str
    backend: str | None  # None: whichever backends ran
    benchmark: str
    mode: str
    metric: str  # "rpcs_per_s" or "p50_us"
    sense: str  # ">=" or "<="
    bound: float
    relative: bool

    def describe(self) -> str:
        over = f" over {self.backend}" if self.backend else ""
        bound = f"{self.bound:g}x {BASE_AGENT}" if self.relative else f"{self.bound:g} us"
        return f"{self.agent}{over} {self.benchmark} {self.mode} {self.metric} {self.sense} {bound}"


TARGETS = (
    Target("reference-tp", None, "light", "async", "rpcs_per_s", ">=", 1.5, True),
    Target("reference-tp", None, "light", "sync", "rpcs_per_s", ">=", 1.5, True),
    Target("reference-tp", None, "light", "sync", "p50_us", "<=", 60.0, False),
    Target("reference-pg", "gloo", "light", "async", "rpcs_per_s", ">=", 0.5, True),
    Target("reference-pg", "gloo", "light", "sync", "rpcs_per_s", ">=", 0.5, True),
    Target("reference-tp", None, "train", TRAIN_MODE, "rpcs_per_s", ">=", 1.0, True),  # steps/s per trainer
)


# ------------------------------------------------------------------ options
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


def load_baseline(path: str) -> dict:
    """A baseline written by --write-baseline, or any stress.json of this tool."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UsageError(f"--baseline: cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--baseline: {path} is not JSON: {exc}") from None
    records = data.get("records") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise UsageError(f"--baseline: {path} has no list of records (expected a file written by --write-baseline)")
    for r in records:
        missing = [k for k in KEY_FIELDS + ("calls", "rpcs_per_s", "p50_us") if k not in r]
        if missing:
            raise UsageError(f"--baseline: {path}: a record lacks {', '.join(missing)}: {json.dumps(r)[:200]}")
    return data


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


# ------------------------------------------------------------------ records
def record_key(r: dict) -> tuple:
    return tuple(r[k] for k in KEY_FIELDS)


def make_record(key: dict, calls: int, results: list[dict]) -> dict:
    """One row from every rank's rpc_bench.measure (or rpc_train.measure) result.

    Timing comes from the ranks that were timed: every rank, or for ``train``
    the trainers (the parameter server only serves); wrong answers from all.
    """
    wrong = sum(r["wrong"] for r in results)
    results = [r for r in results if r.get("timed", True)]
    seconds = max(r["seconds"] for r in results)
    sync = results[0]["samples_ns"] is not None
    per_rank_p50 = [metrics.percentile(r["samples_ns"], 50) / 1e3 for r in results] if sync else None
    per_rank_p99 = [metrics.percentile(r["samples_ns"], 99) / 1e3 for r in results] if sync else None
    record = dict(key)
    record.update({
        "calls": calls, "warmup": results[0]["warmup"],
        "rpcs_per_s": calls / seconds if seconds > 0 else None,
        "p50_us": max(per_rank_p50) if sync else None,
        "p99_us": max(per_rank_p99) if sync else None,
        "seconds": seconds,
        "per_rank_rpcs_per_s": [calls / r["seconds"] if r["seconds"] > 0 else None for r in results],
        "per_rank_seconds": [r["seconds"] for r in results],
        "per_rank_p50_us": per_rank_p50, "per_rank_p99_us": per_rank_p99,
        "wrong": wrong,
    })
    if key["benchmark"] == "train":
        record["steps_per_s"] = record["rpcs_per_s"]
    if key["profiled"]:
        profiles = [r["profile"] for r in results]
        record["profile"] = {"events": sum(p["events"] for p in profiles),
                             "rpc_records": sum(p["rpc_records"] for p in profiles),
                             "remote_events": sum(p["remote_events"] for p in profiles),
                             "exit_seconds": max(p["exit_seconds"] for p in profiles)}
    return record


def best_of(key: dict, calls: int, runs: list[list[dict]]) -> dict:
    """The record of the fastest of --repeat runs (least noise from other processes); every run's figures kept."""
    records = [make_record(key, calls, results) for results in runs]
    best = min(records, key=lambda r: r["seconds"])
    best["repeats"] = [{k: r[k] for k in ("rpcs_per_s", "p50_us", "p99_us", "seconds")} for r in records]
    best["wrong"] = sum(r["wrong"] for r in records)
    return best


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(a, b):
    return None if a is None or not b else a / b


class RpcBench:
    """Runs every agent in every (backend, world size) world and collects records and errors."""

    def __init__(self, args):
        self.args = args
        self.records: list[dict] = []
        self.errors: list[dict] = []
        self.unavailable: list[dict] = []
        self._init_dir = tempfile.mkdtemp(prefix="distconform-rpc-stress-")
        self._starts = 0
        self._started = weakref.WeakKeyDictionary()  # World -> agents started in its processes
        self.progress = Progress(0, enabled=False)  # run() makes the real one (a terminal only)

    # -------------------------------------------------------------- errors
    def _error(self, key: dict, stage: str, exc: BaseException, skipped=()) -> None:
        text = str(exc) or repr(exc)
        lines = [line for line in text.splitlines() if line.strip()]
        first = lines[0] if lines else type(exc).__name__
        if first.endswith(":") and len(lines) > 1:  # "measure raised on ranks [...]:" + the first rank's error
            first += " " + lines[1].strip()
        entry = dict(key, stage=stage, error=f"{type(exc).__name__}: {first}", detail=text[:50000])
        if skipped:
            entry["not_run"] = [f"{b} {m}{' profiled' if p else ''}" for b, m, p in skipped]
        self.errors.append(entry)
        where = f"{key.get('benchmark', '')} {key.get('mode', '')}{' profiled' if key.get('profiled') else ''}"
        say(f"# ERROR {key['agent']} {key['backend']} ws{key['world_size']} {stage} {where.strip()}: {entry['error']}")
        if entry.get("not_run"):
            say(f"#   not run: {', '.join(entry['not_run'])}")
        if "\n" in text:
            say("#   (the full message, with every rank's stack or traceback, is in stress.json under errors)")

    # ---------------------------------------------------------------- run
    def usable_agents(self) -> list[str]:
        usable = []
        for name in self.args.agents:
            availability = rpc_agents.get(name).availability()
            reason = availability.reason
            if availability.available and not callable(getattr(rpc_agents.api(name), "init_rpc", None)):
                reason = f"{rpc_agents.get(name).module} has no init_rpc yet"
            if availability.available and not reason:
                usable.append(name)
                continue
            self.unavailable.append({"agent": name, "backend": None, "world_size": None, "reason": reason})
            say(f"# agent {name}: unavailable, skipped: {reason}")
        return usable

    def run(self, registry) -> None:
        agents = self.usable_agents()
        args = self.args
        self.progress = Progress(len(agents) * len(args.backends) * len(args.world_sizes) * len(plan(args)))
        with self.progress:
            self._sweep(registry, agents)

    def _sweep(self, registry, agents) -> None:
        steps_per_world = len(agents) * len(plan(self.args))
        try:
            for backend in self.args.backends:
                spec = registry.get(backend)
                availability = spec.availability()
                if not availability.available:
                    self.unavailable.append({"agent": None, "backend": backend, "world_size": None,
                                             "reason": availability.reason})
                    say(f"# backend {backend}: unavailable, skipped: {availability.reason}")
                    self.progress.skip(steps_per_world * len(self.args.world_sizes))
                    continue
                for world_size in self.args.world_sizes:
                    devices = device_plan(spec, world_size)
                    if isinstance(devices, str):
                        self.unavailable.append({"agent": None, "backend": backend, "world_size": world_size,
                                                 "reason": devices})
                        say(f"# backend {backend} world_size={world_size}: unavailable, skipped: {devices}")
                        self.progress.skip(steps_per_world)
                        continue
                    slot = WorldSlot(spec, world_size, devices, plugins=self.args.backend_plugin,
                                     deadline=self.args.deadline)
                    try:
                        for agent in agents:
                            self._run_agent(slot, agent, backend, world_size)
                    finally:
                        slot.close()
        finally:
            shutil.rmtree(self._init_dir, ignore_errors=True)

    def _start(self, slot: WorldSlot, key: dict, remaining) -> bool:
        from suites.stress import rpc_bench

        try:
            world = slot.get()
            if key["agent"] in self._started.get(world, ()) and rpc_agents.get(key["agent"]).one_start_per_process:
                world.kill()  # a second start in these processes would not be a clean agent (rpc_agents.py)
                world = slot.get()
        except Exception as exc:
            self._error(key, "world start", exc, remaining)
            return False
        self._started.setdefault(world, set()).add(key["agent"])
        self._starts += 1
        init_file = os.path.join(self._init_dir, f"init-{self._starts}")
        try:
            world.run(rpc_bench.start, key["agent"], init_file, self.args.rpc_timeout, self.args.num_worker_threads,
                      deadline=self.args.deadline)
        except Exception as exc:
            self._error(key, "agent start", exc, remaining)
            self._abandon(slot, key["agent"])
            return False
        return True

    def _abandon(self, slot: WorldSlot, agent: str) -> None:
        """After a failure: stop the agent without the handshake, or kill the world if even that fails."""
        from suites.stress import rpc_bench

        world = slot.world
        if world is None or not world.alive:
            return  # the world was killed (hang, dead rank): the agent went with it
        try:
            world.run(rpc_bench.stop, agent, False, deadline=min(self.args.deadline, 20.0))
        except Exception:
            world.kill()

    def _run_agent(self, slot: WorldSlot, agent: str, backend: str, world_size: int) -> None:
        from suites.stress import rpc_bench, rpc_train

        args = self.args
        steps = plan(args)
        base = {"agent": agent, "backend": backend, "world_size": world_size}
        running = False
        for index, (benchmark, mode, profiled) in enumerate(steps):
            key = dict(base, benchmark=benchmark, mode=mode, profiled=profiled)
            self.progress.start(f"{agent} {backend} ws{world_size} {benchmark} {mode}{' profiled' if profiled else ''}")
            if not running:
                if not self._start(slot, key, steps[index:]):
                    self.progress.skip(len(steps) - index)
                    return  # an agent that cannot start is one error, not one per measurement
                running = True
            calls = calls_of(args, benchmark)
            udf = args.planted.get(agent) if benchmark == "light" else None
            started = time.monotonic()
            try:
                if benchmark == "train":
                    slot.world.run(rpc_train.prepare, agent, deadline=max(args.deadline, IMPORT_DEADLINE_S))
                    runs = [slot.world.run(rpc_train.measure, agent, steps=calls, warmup=args.warmup,
                                           deadline=args.deadline) for _ in range(args.repeat)]
                else:
                    runs = [slot.world.run(rpc_bench.measure, agent, benchmark, mode, calls=calls,
                                           warmup=args.warmup, profiled=profiled, udf=udf, deadline=args.deadline)
                            for _ in range(args.repeat)]
            except Exception as exc:
                # RankError (an RPC failed), DeadlineExceeded (a hang: stacks in the JSON),
                # RankDied: this measurement is an error row; the agent is stopped (or the
                # world replaced) and started afresh for the next one.
                self._error(key, "measure", exc)
                self._abandon(slot, agent)
                running = False
                self.progress.step()
                continue
            self.progress.step()
            record = best_of(key, calls, runs)
            record["wall_s"] = time.monotonic() - started
            self.records.append(record)
            say(progress_line(record))
        if running:
            try:
                slot.world.run(rpc_bench.stop, agent, True, deadline=args.deadline)
            except Exception as exc:
                self._error(dict(base, benchmark=None, mode=None, profiled=None), "agent stop", exc)
                self._abandon(slot, agent)


def calls_of(args, benchmark: str) -> int:
    return {"light": args.calls, "heavy": args.heavy_calls, "train": args.train_steps}[benchmark]


def progress_line(r: dict) -> str:
    what = f"{r['agent']} {r['backend']} ws{r['world_size']} {r['benchmark']} {r['mode']}"
    what += " profiled" if r["profiled"] else ""
    if r["benchmark"] == "train":
        text = (f"# {what}: {r['calls']} steps per trainer in {r['seconds']:.3f} s, "
                f"{_fmt(r['rpcs_per_s'], 1)} steps/s per trainer")
    else:
        text = f"# {what}: {r['calls']} calls in {r['seconds']:.3f} s, {_fmt(r['rpcs_per_s'], 0)} RPC/s per rank"
    if r["p50_us"] is not None:
        text += f", p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us"
    if r["wrong"]:
        text += f", {r['wrong']} WRONG answers"
    return text


# ------------------------------------------------------------------ comparison
def add_ratios(records: list[dict]) -> None:
    """x_tensorpipe: RPCs/s over tensorpipe's in the same world and mode; overhead: profiled / unprofiled time."""
    by_key = {record_key(r): r for r in records}
    for r in records:
        key = dict(zip(KEY_FIELDS, record_key(r)))
        base = by_key.get(record_key(dict(key, agent=BASE_AGENT)))
        r["x_tensorpipe"] = _ratio(r["rpcs_per_s"], base["rpcs_per_s"]) if base else None
        if r["profiled"]:
            plain = by_key.get(record_key(dict(key, profiled=False)))
            r["overhead"] = _ratio(r["seconds"], plain["seconds"]) if plain else None


def headline(records: list[dict], args, unavailable: list[dict]) -> list[dict]:
    """The reference agents' targets (benchmark figures, never assertions)."""
    reasons = {u["agent"]: u["reason"] for u in unavailable if u["agent"]}
    lines = []
    for t in TARGETS:
        entry = {"target": t.describe(), "agent": t.agent, "benchmark": t.benchmark, "mode": t.mode,
                 "metric": t.metric, "sense": t.sense, "bound": t.bound, "relative": t.relative,
                 "value": None, "status": "NOT MEASURED", "why": ""}
        match = [r for r in records if r["agent"] == t.agent and r["benchmark"] == t.benchmark
                 and r["mode"] == t.mode and not r["profiled"] and (t.backend is None or r["backend"] == t.backend)]
        values = [r["x_tensorpipe"] if t.relative else r[t.metric] for r in match]
        values = [v for v in values if v is not None]
        if values:
            value = min(values) if t.sense == ">=" else max(values)  # the worst world counts
            entry["value"] = value
            entry["status"] = "PASS" if (value >= t.bound if t.sense == ">=" else value <= t.bound) else "MISS"
        elif t.agent not in args.agents or (t.relative and BASE_AGENT not in args.agents):
            entry["why"] = f"needs --agent {BASE_AGENT + ',' if t.relative else ''}{t.agent}"
        elif t.agent in reasons or (t.relative and BASE_AGENT in reasons):
            who = t.agent if t.agent in reasons else BASE_AGENT
            entry["why"] = f"{who} unavailable: {reasons[who]}"
        elif t.backend and t.backend not in args.backends:
            entry["why"] = f"needs --backend {t.backend}"
        elif t.benchmark not in args.benchmark_list or t.mode not in args.mode_list:
            entry["why"] = "benchmark or mode not in this run"
        else:
            entry["why"] = "no result (see the errors)"
        lines.append(entry)
    return lines


def check_regressions(records: list[dict], baseline: dict, max_pct: float) -> tuple[list[dict], list[dict]]:
    """(regressions, records without a comparable baseline record) against ``baseline``'s records.

    A record regressed when its RPCs/s is lower, or its p50 higher, than the
    baseline's same (agent, backend, world size, benchmark, mode, profiled) by
    more than ``max_pct`` percent. A baseline record with another call count
    is not comparable: the record is listed as missing, not failed.
    """
    base = {record_key(b): b for b in baseline["records"]}
    regressions, missing = [], []
    for r in records:
        b = base.get(record_key(r))
        if b is None or b["calls"] != r["calls"]:
            why = "not in the baseline" if b is None else f"baseline has {b['calls']} calls, this run {r['calls']}"
            missing.append(dict(zip(KEY_FIELDS, record_key(r)), why=why))
            continue
        found = []
        if r["rpcs_per_s"] is not None and b["rpcs_per_s"]:
            change = 100.0 * (b["rpcs_per_s"] - r["rpcs_per_s"]) / b["rpcs_per_s"]
            if change > max_pct:
                found.append(("rpcs_per_s", b["rpcs_per_s"], r["rpcs_per_s"], f"{change:.1f}% lower"))
        if r["p50_us"] is not None and b["p50_us"]:
            change = 100.0 * (r["p50_us"] - b["p50_us"]) / b["p50_us"]
            if change > max_pct:
                found.append(("p50_us", b["p50_us"], r["p50_us"], f"{change:.1f}% higher"))
        for metric, was, now, change in found:
            regressions.append(dict(zip(KEY_FIELDS, record_key(r)), metric=metric, baseline=was, value=now,
                                    change=change, max_regression_pct=max_pct))
    return regressions, missing


# ------------------------------------------------------------------ output
TABLE = (("agent", 13), ("backend", 9), ("ws", 3), ("rpcs_per_s", 11), ("p50_us", 10), ("p99_us", 10),
         ("seconds", 9), ("x_tensorpipe", 12), ("wrong", 6))
PROFILE_TABLE = (("agent", 13), ("backend", 9), ("ws", 3), ("rpcs_per_s", 11), ("prof_rpcs_s", 11),
                 ("seconds", 9), ("prof_seconds", 12), ("overhead", 9), ("p50_us", 9), ("prof_p50_us", 11),
                 ("events", 8), ("remote_ev", 9))


def _line(cells, columns) -> str:
    return "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, columns))


def _header(columns) -> str:
    return "#" + _line([h for h, _ in columns], columns)[1:]


def _sections(args):
    return [(b, TRAIN_MODE) if b == "train" else (b, m) for b in args.benchmark_list
            for m in ([TRAIN_MODE] if b == "train" else args.mode_list)]


def _section_title(args, benchmark: str, mode: str) -> str:
    if benchmark == "train":
        return (f"# distributed training ({args.train_steps} steps per trainer: forward over RPC, dist backward, "
                "DistributedOptimizer step; rank 0 the parameter server): rpcs_per_s = steps/s per trainer, "
                "p50/p99 = step time")
    calls = calls_of(args, benchmark)
    return (f"# {benchmark} RPC, {mode} ({'burst of rpc_async + wait_all' if mode == 'async' else 'loop of rpc_sync'}), "
            f"{calls} calls per rank to rank+1")


def print_tables(records: list[dict], errors: list[dict], args) -> None:
    for benchmark, mode in _sections(args):
        say()
        say(_section_title(args, benchmark, mode))
        say(_header(TABLE))
        for r in records:
            if r["benchmark"] == benchmark and r["mode"] == mode and not r["profiled"]:
                rate = _fmt(r["rpcs_per_s"], 1 if benchmark == "train" else 0)
                say(_line((r["agent"], r["backend"], r["world_size"], rate, _fmt(r["p50_us"]),
                           _fmt(r["p99_us"]), f"{r['seconds']:.3f}", _fmt(r["x_tensorpipe"], 2), r["wrong"]), TABLE))
        for e in errors:
            if (e.get("benchmark"), e.get("mode"), e.get("profiled")) == (benchmark, mode, False):
                say(f"{e['agent']:>13}  {e['backend']:>9}  {e['world_size']:>3}  ERROR ({e['stage']}): {e['error'][:200]}")
    if errors:
        say()
        say(f"# {len(errors)} errors (details with every rank's stack or traceback in stress.json):")
        for e in errors:
            what = " ".join(str(x) for x in (e.get("benchmark"), e.get("mode")) if x)
            what += " profiled" if e.get("profiled") else ""
            say(f"#   {e['agent']} {e['backend']} ws{e['world_size']} {e['stage']} {what}: {e['error'][:160]}")
            if e.get("not_run"):
                say(f"#     not run: {', '.join(e['not_run'])}")


def print_profile_table(records: list[dict]) -> None:
    profiled = [r for r in records if r["profiled"]]
    if not profiled:
        return
    plain = {record_key(r): r for r in records if not r["profiled"]}
    say()
    say("# under torch.autograd.profiler_legacy.profile: before (unprofiled) / after (profiled); "
        "overhead = profiled seconds / unprofiled seconds")
    for benchmark, mode in dict.fromkeys((r["benchmark"], r["mode"]) for r in profiled):  # in run order
        say(f"# {benchmark} {mode}")
        say(_header(PROFILE_TABLE))
        for r in profiled:
            if (r["benchmark"], r["mode"]) != (benchmark, mode):
                continue
            p = plain.get(record_key(dict(r, profiled=False)))
            say(_line((r["agent"], r["backend"], r["world_size"], _fmt(p and p["rpcs_per_s"], 0),
                       _fmt(r["rpcs_per_s"], 0), _fmt(p and p["seconds"], 3), f"{r['seconds']:.3f}",
                       _fmt(r.get("overhead"), 2), _fmt(p and p["p50_us"]), _fmt(r["p50_us"]),
                       r["profile"]["events"], r["profile"]["remote_events"]), PROFILE_TABLE))
            if p:  # per rank, as seed 001's before/after ("Rank N finished testing 1000 times in X seconds")
                say(f"#{'':>12}  per-rank seconds before {_per_rank(p)} | after {_per_rank(r)}")


def _per_rank(record: dict) -> str:
    return " ".join(f"{s:.3f}" for s in record["per_rank_seconds"])


def print_headline(lines: list[dict]) -> None:
    say()
    say(f"# headline targets (benchmark figures, not assertions; ratios are x {BASE_AGENT} in the same world)")
    for h in lines:
        if h["value"] is None:
            say(f"#   {h['target']}: {h['status']} ({h['why']})")
        else:
            unit = "x" if h["relative"] else " us"
            say(f"#   {h['target']}: {h['value']:.2f}{unit} {h['status']}")


def print_regressions(regressions: list[dict], missing: list[dict], args) -> None:
    say()
    say(f"# regression check against {args.baseline} (more than {args.max_regression:g}% worse fails)")
    for g in regressions:
        say(f"#   REGRESSED {g['agent']} {g['backend']} ws{g['world_size']} {g['benchmark']} {g['mode']}"
            f"{' profiled' if g['profiled'] else ''}: {g['metric']} {g['value']:.1f} vs {g['baseline']:.1f} "
            f"({g['change']})")
    for m in missing:
        say(f"#   not compared: {m['agent']} {m['backend']} ws{m['world_size']} {m['benchmark']} {m['mode']}"
            f"{' profiled' if m['profiled'] else ''}: {m['why']}")
    if not regressions:
        say("#   no regressions")


def _config(args) -> dict:
    return {"agents": args.agents, "backends": args.backends, "world_sizes": args.world_sizes,
            "benchmarks": args.benchmark_list, "modes": args.mode_list, "calls": args.calls,
            "heavy_calls": args.heavy_calls, "train_steps": args.train_steps, "warmup": args.warmup,
            "repeat": args.repeat, "profile": args.profile,
            "profile_benchmarks": args.profiled_list if args.profile else [],
            "deadline": args.deadline, "rpc_timeout": args.rpc_timeout,
            "num_worker_threads": args.num_worker_threads, "backend_plugins": args.backend_plugin,
            "planted": args.planted}


def write_baseline(path: str, args, records: list[dict], host: dict) -> None:
    data = {"tool": "suites.stress.rpc",
            "command": "python -m suites.stress.rpc " + " ".join(shlex.quote(a) for a in args.argv),
            "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": host, "host_after": host_info(), "config": _config(args), "records": records}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    say(f"# baseline written: {path}")


def print_preamble(args, host: dict) -> None:
    say(f"# distconform RPC stress benchmark: agents {','.join(args.agents)}, backends {','.join(args.backends)}, "
        f"world sizes {','.join(map(str, args.world_sizes))}; light {args.calls} calls, heavy {args.heavy_calls} "
        f"calls per rank, train {args.train_steps} steps per trainer, {args.warmup} warm-ups, "
        f"best of {args.repeat}{', with --profile' if args.profile else ''}")
    say(f"# host: {host.get('cpus')} cpus, load average {host.get('load_average')} (figures are noisy under load)")
    say("# rpcs_per_s: calls / seconds of the slowest rank; p50_us/p99_us: per-call latency of the sync loop, "
        "max over ranks (train: steps/s per trainer and step times)")


# ------------------------------------------------------------------ main
def main(argv=None) -> int:
    args = parse_args(argv)
    registry = backend_registry(args.backend_plugin, args.backends)
    if registry is None:
        return 2
    host = host_info()
    print_preamble(args, host)
    started = time.monotonic()
    bench = RpcBench(args)
    run_until_interrupted(bench.run, registry)
    records = bench.records
    add_ratios(records)
    heads = headline(records, args, bench.unavailable)
    regressions, missing = ([], [])
    if args.baseline_data is not None:
        regressions, missing = check_regressions(records, args.baseline_data, args.max_regression)
    wrong_total = sum(r["wrong"] for r in records)
    status = 1 if bench.errors or wrong_total or regressions else 0

    print_tables(records, bench.errors, args)
    print_profile_table(records)
    print_headline(heads)
    if args.baseline_data is not None:
        print_regressions(regressions, missing, args)
    say()
    for r in records:
        if r["wrong"]:
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
        "records": records,
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
