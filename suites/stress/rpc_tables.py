"""What the RPC benchmark prints: the preamble, a line per measurement, the tables per (benchmark, mode),
the profiled before/after table, the headline targets and the regression check."""

from __future__ import annotations

import argparse
import dataclasses

from suites.rpc.call_modes import by_exec_mode
from suites.stress.common import say
from suites.stress.records import RpcKey, RpcRecord
from suites.stress.rpc_figures import BASE_AGENT
from suites.stress.rpc_options import TRAIN_MODE, calls_of

TABLE = (("agent", 13), ("backend", 9), ("ws", 3), ("rpcs_per_s", 11), ("p50_us", 10), ("p99_us", 10),
         ("seconds", 9), ("x_tensorpipe", 12), ("wrong", 6))
PROFILE_TABLE = (("agent", 13), ("backend", 9), ("ws", 3), ("rpcs_per_s", 11), ("prof_rpcs_s", 11),
                 ("seconds", 9), ("prof_seconds", 12), ("overhead", 9), ("p50_us", 9), ("prof_p50_us", 11),
                 ("events", 8), ("remote_ev", 9))


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def progress_line(r: RpcRecord) -> str:
    what = r.key.describe()
    if r.key.benchmark == "train":
        text = (f"# {what}: {r.calls} steps per trainer in {r.seconds:.3f} s, "
                f"{fmt(r.rpcs_per_s, 1)} steps/s per trainer")
    else:
        text = f"# {what}: {r.calls} calls in {r.seconds:.3f} s, {fmt(r.rpcs_per_s, 0)} RPC/s per rank"
    if r.p50_us is not None:
        text += f", p50 {r.p50_us:.1f} us, p99 {fmt(r.p99_us)} us"
    if r.wrong:
        text += f", {r.wrong} WRONG answers"
    return text


def _line(cells, columns) -> str:
    return "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, columns))


def _header(columns) -> str:
    return "#" + _line([h for h, _ in columns], columns)[1:]


def _sections(args: argparse.Namespace) -> list[tuple[str, str]]:
    return [(b, TRAIN_MODE) if b == "train" else (b, m) for b in args.benchmark_list
            for m in ([TRAIN_MODE] if b == "train" else args.mode_list)]


def _section_title(args: argparse.Namespace, benchmark: str, mode: str) -> str:
    if benchmark == "train":
        return (f"# distributed training ({args.train_steps} steps per trainer: forward over RPC, dist backward, "
                "DistributedOptimizer step; rank 0 the parameter server): rpcs_per_s = steps/s per trainer, "
                "p50/p99 = step time")
    calls, call = calls_of(args, benchmark), by_exec_mode(mode)
    how = f"loop of {call.name}" if call.blocking else f"burst of {call.name} + wait_all"
    return f"# {benchmark} RPC, {mode} ({how}), {calls} calls per rank to rank+1"


def print_tables(records: list[RpcRecord], errors: list[dict], args: argparse.Namespace) -> None:
    for benchmark, mode in _sections(args):
        say()
        say(_section_title(args, benchmark, mode))
        say(_header(TABLE))
        for r in records:
            if (r.key.benchmark, r.key.mode, r.key.profiled) == (benchmark, mode, False):
                rate = fmt(r.rpcs_per_s, 1 if benchmark == "train" else 0)
                say(_line((r.key.agent, r.key.backend, r.key.world_size, rate, fmt(r.p50_us), fmt(r.p99_us),
                           f"{r.seconds:.3f}", fmt(r.x_tensorpipe, 2), r.wrong), TABLE))
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


def print_profile_table(records: list[RpcRecord]) -> None:
    profiled = [r for r in records if r.key.profiled]
    if not profiled:
        return
    plain = {r.key: r for r in records if not r.key.profiled}
    say()
    say("# under torch.autograd.profiler_legacy.profile: before (unprofiled) / after (profiled); "
        "overhead = profiled seconds / unprofiled seconds")
    for benchmark, mode in dict.fromkeys((r.key.benchmark, r.key.mode) for r in profiled):  # in run order
        say(f"# {benchmark} {mode}")
        say(_header(PROFILE_TABLE))
        for r in profiled:
            if (r.key.benchmark, r.key.mode) != (benchmark, mode):
                continue
            p = plain.get(_unprofiled(r))
            before = (p.rpcs_per_s, p.seconds, p.p50_us) if p else (None, None, None)
            events, remote = (r.profile.events, r.profile.remote_events) if r.profile else (None, None)
            say(_line((r.key.agent, r.key.backend, r.key.world_size, fmt(before[0], 0),
                       fmt(r.rpcs_per_s, 0), fmt(before[1], 3), f"{r.seconds:.3f}",
                       fmt(r.overhead, 2), fmt(before[2]), fmt(r.p50_us), events, remote), PROFILE_TABLE))
            if p:  # per rank, as seed 001's before/after ("Rank N finished testing 1000 times in X seconds")
                say(f"#{'':>12}  per-rank seconds before {_per_rank(p)} | after {_per_rank(r)}")


def _unprofiled(r: RpcRecord) -> RpcKey:
    return dataclasses.replace(r.key, profiled=False)


def _per_rank(record: RpcRecord) -> str:
    return " ".join(f"{s:.3f}" for s in record.per_rank_seconds)


def print_headline(lines: list[dict]) -> None:
    say()
    say(f"# headline targets (benchmark figures, not assertions; ratios are x {BASE_AGENT} in the same world)")
    for h in lines:
        if h["value"] is None:
            say(f"#   {h['target']}: {h['status']} ({h['why']})")
        else:
            unit = "x" if h["relative"] else " us"
            say(f"#   {h['target']}: {h['value']:.2f}{unit} {h['status']}")


def print_regressions(regressions: list[dict], missing: list[dict], args: argparse.Namespace) -> None:
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


def print_preamble(args: argparse.Namespace, host: dict) -> None:
    say(f"# distconform RPC stress benchmark: agents {','.join(args.agents)}, backends {','.join(args.backends)}, "
        f"world sizes {','.join(map(str, args.world_sizes))}; light {args.calls} calls, heavy {args.heavy_calls} "
        f"calls per rank, train {args.train_steps} steps per trainer, {args.warmup} warm-ups, "
        f"best of {args.repeat}{', with --profile' if args.profile else ''}")
    say(f"# host: {host.get('cpus')} cpus, load average {host.get('load_average')} (figures are noisy under load)")
    say("# rpcs_per_s: calls / seconds of the slowest rank; p50_us/p99_us: per-call latency of the sync loop, "
        "max over ranks (train: steps/s per trainer and step times)")
