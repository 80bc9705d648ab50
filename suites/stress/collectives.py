"""Collective micro-benchmark in the manner of nccl-tests, for any c10d backend.

    python -m suites.stress.collectives --backend gloo,reference --world-size 2,4

For every (backend, world size, collective) it prints a table with one row per
size: size (B), count (elements), type, redop, root, time_us (p50), p99_us,
algbw and busbw (GB/s, from the p50 time) and #wrong, using nccl-tests'
definitions of size and bus bandwidth (suites/stress/metrics.py). Sizes go
from --min-bytes to --max-bytes by --step-factor, plus --max-bytes itself and
the headline sizes (8 B and 16 MiB) when they are in range.

Measurement (suites/stress/rank_bench.py): every rank times every iteration
(op + wait) after a barrier; a row reports, per percentile, the maximum over
ranks. Each size gets about --target-seconds of timed work, between
--min-iters and --iters iterations, after up to --warmup warm-ups. Then the
inputs are re-filled, the operation runs once more and every element is
checked against the oracle (backends/reference/semantics.py); #wrong is the
number of wrong elements summed over ranks.

Every backend x world size runs in its own persistent World (fixtures/world.py),
closed at the end; every distributed call has a deadline, so a hang or a dead
rank becomes an error for that backend and collective, never a stuck run. A
backend that is not usable here is listed with its reason and skipped.

Output: the tables, a side-by-side comparison of every backend with
--baseline (ratios of busbw and of time per collective, world size and size),
and the headline targets: reference all_reduce busbw >= 0.5x gloo at 16 MiB
and latency <= 3x gloo at 8 B, at world sizes 2 and 4 (PASS/MISS; these are
benchmark figures, not assertions). Everything also goes to
<report-dir>/collectives.json.

Exit status: 0; 1 if any element was wrong or a run failed (error, hang,
dead rank); 2 for a usage error. Unavailable backends do not count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from suites.collectives import Collective
from suites.stress import metrics
from suites.stress.common import (WorldSlot, backend_registry, csv_list as _csv, device_plan, host_info,
                                  run_until_interrupted, say)
from suites.stress.metrics import DEFAULT_COLLECTIVES, collective_names
from suites.stress.progress import Progress
from suites.stress.records import CollectiveRow

MIB = 1 << 20
# (what, collective, size in bytes, comparison, target ratio candidate/baseline)
HEADLINE_TARGETS = (
    ("busbw", "all_reduce", 16 * MIB, ">=", 0.5),
    ("latency", "all_reduce", 8, "<=", 3.0),
)
HEADLINE_WORLD_SIZES = (2, 4)
HEADLINE_CANDIDATE = "reference"
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int16", "int8", "uint8")

COLUMNS = (  # (json key, header, width); the cells in this order: table_row
    ("size", "size", 12), ("count", "count", 12), ("type", "type", 9), ("redop", "redop", 6),
    ("root", "root", 5), ("time_us", "time_us", 11), ("p99_us", "p99_us", 11), ("algbw", "algbw", 9),
    ("busbw", "busbw", 9), ("#wrong", "#wrong", 7),
)
UNITS = {"size": "(B)", "count": "(elements)", "time_us": "(p50)", "algbw": "(GB/s)", "busbw": "(GB/s)"}


# ------------------------------------------------------------------ options
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m suites.stress.collectives",
        description="Collective micro-benchmark (nccl-tests style) over c10d backends.")
    parser.add_argument("--backend", default="gloo", help="comma-separated backends (default: gloo)")
    parser.add_argument("--world-size", default="2,4", help="comma-separated world sizes (default: 2,4)")
    parser.add_argument("--collectives", default=",".join(DEFAULT_COLLECTIVES),
                        help=f"comma-separated, from {', '.join(collective_names())} (nccl-tests' names; *_list: "
                             f"torch's list forms), or 'all' (default: {','.join(DEFAULT_COLLECTIVES)})")
    parser.add_argument("--min-bytes", default="8", help="smallest size, e.g. 8, 4K (default: 8)")
    parser.add_argument("--max-bytes", default="64M", help="largest size, e.g. 4K, 64M (default: 64M)")
    parser.add_argument("--step-factor", type=int, default=4, help="size multiplier between rows (default: 4)")
    parser.add_argument("--iters", type=int, default=100, help="most timed iterations per size (default: 100)")
    parser.add_argument("--min-iters", type=int, default=3, help="fewest timed iterations per size (default: 3)")
    parser.add_argument("--warmup", type=int, default=5, help="most warm-up iterations per size (default: 5)")
    parser.add_argument("--target-seconds", type=float, default=0.2,
                        help="timed work per size; iterations scale down with size (default: 0.2)")
    parser.add_argument("--max-seconds-per-size", type=float, default=30.0,
                        help="skip the larger sizes of a collective once one size would take longer (default: 30)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="element type (default: float32)")
    parser.add_argument("--baseline", default="gloo", help="backend the others are compared with (default: gloo)")
    parser.add_argument("--report-dir", default="reports/out", help="where collectives.json goes (default: reports/out)")
    parser.add_argument("--backend-plugin", action="append", default=[], metavar="MODULE",
                        help="module that registers a backend (repeatable), imported here and in every rank")
    parser.add_argument("--deadline", type=float, default=60.0,
                        help="seconds one distributed call may take beyond its expected duration (default: 60)")
    args = parser.parse_args(argv)

    args.backends = _csv(args.backend)
    if not args.backends:
        parser.error("--backend: no backend given")
    try:
        args.world_sizes = sorted({int(x) for x in _csv(args.world_size)})
    except ValueError:
        parser.error(f"--world-size: {args.world_size!r} is not a list of integers (expected e.g. 2,4)")
    if not args.world_sizes or min(args.world_sizes) < 1:
        parser.error("--world-size: need world sizes >= 1 (e.g. 2,4)")
    args.collective_list = _csv(args.collectives)
    if args.collective_list == ["all"]:
        args.collective_list = collective_names()
    unknown = [c for c in args.collective_list if c not in collective_names()]
    if unknown and args.backend_plugin:  # a plugin may add collectives to the table: look again after importing it
        _import_plugins(args.backend_plugin)
        unknown = [c for c in args.collective_list if c not in collective_names()]
    if unknown or not args.collective_list:
        parser.error(f"--collectives: unknown {', '.join(unknown) or '(none given)'}; "
                     f"known: {', '.join(collective_names())}")
    # the names become the table's records here, once; everything after takes the records
    args.collective_records = [metrics.entry(name) for name in args.collective_list]
    try:
        args.sizes = metrics.size_sweep(metrics.parse_bytes(args.min_bytes), metrics.parse_bytes(args.max_bytes),
                                        args.step_factor, extra=[t[2] for t in HEADLINE_TARGETS])
    except ValueError as exc:
        parser.error(str(exc))
    if args.iters < 1 or args.min_iters < 1 or args.warmup < 1:
        parser.error("--iters, --min-iters and --warmup must be >= 1")
    args.min_iters = min(args.min_iters, args.iters)
    return args


def _import_plugins(modules) -> None:
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - backend_registry reports a broken plugin with its error
            pass


# ------------------------------------------------------------------ output

def table_header(backend: str, world_size: int, collective: str, dtype: str) -> str:
    title = f"# {backend}  world_size={world_size}  {collective}  ({dtype})"
    names = "#" + "  ".join(h.rjust(w) for _, h, w in COLUMNS)[1:]
    units = "#" + "  ".join(UNITS.get(k, "").rjust(w) for k, _, w in COLUMNS)[1:]
    return "\n".join((title, names, units))


def table_row(row: CollectiveRow) -> str:
    cells = (row.size, row.count, row.dtype, row.redop, row.root, f"{row.time_us:.1f}", f"{row.p99_us:.1f}",
             f"{row.algbw:.3f}", f"{row.busbw:.3f}", row.wrong)
    return "  ".join(str(cell).rjust(w) for cell, (_, _, w) in zip(cells, COLUMNS))


# ------------------------------------------------------------------ rows
def make_record(backend: str, world_size: int, collective: Collective, dtype: str, results: list[dict],
                wall_s: float) -> CollectiveRow:
    """One table row from every rank's bench_row result (``collective``: the table's record)."""
    p50 = max(metrics.percentile(r["samples"], 50) for r in results)
    p99 = max(metrics.percentile(r["samples"], 99) for r in results)
    size = results[0]["size"]
    return CollectiveRow(
        backend=backend, world_size=world_size, collective=collective.bench_name,
        size=size, count=results[0]["count"], dtype=dtype,
        redop="sum" if collective.reduces else "none",
        root=0 if collective.rooted else -1,
        p50_us=p50 * 1e6, p99_us=p99 * 1e6,
        algbw=metrics.algbw(size, p50), busbw=metrics.busbw(collective, world_size, size, p50),
        bus_factor=metrics.bus_factor(collective, world_size),
        wrong=sum(r["wrong"] for r in results),
        iters=results[0]["iters"], warmup=results[0]["warmup"], wall_s=wall_s,
    )


class Bench:
    """Runs the whole sweep and collects records, errors and skips."""

    def __init__(self, args):
        self.args = args
        self.records: list[CollectiveRow] = []
        self.errors: list[dict] = []
        self.unavailable: list[dict] = []
        self.skipped: list[dict] = []
        self.progress = Progress(0, enabled=False)  # run() makes the real one (a terminal only)

    def _error(self, backend: str, world_size: int, collective, size, exc: BaseException) -> None:
        text = str(exc) or repr(exc)
        first = text.splitlines()[0] if text else type(exc).__name__
        self.errors.append({"backend": backend, "world_size": world_size, "collective": collective,
                            "size": size, "error": f"{type(exc).__name__}: {first}", "detail": text[:50000]})
        where = f"{collective} at {metrics.format_bytes(size)}" if collective else "world start"
        say(f"# ERROR {backend} world_size={world_size} {where}: {type(exc).__name__}: {first}")
        if "\n" in text:
            say("#   (the full message, with every rank's stack or traceback, is in collectives.json under errors)")

    # ---------------------------------------------------------------- run
    def run(self, registry) -> None:
        targets = []  # (backend, spec, plan) usable here
        for name in self.args.backends:
            spec = registry.get(name)
            availability = spec.availability()
            if not availability.available:
                self.unavailable.append({"backend": name, "world_size": None, "reason": availability.reason})
                say(f"# backend {name}: unavailable, skipped: {availability.reason}")
                continue
            targets.append((name, spec))

        args = self.args
        self.progress = Progress(len(targets) * len(args.world_sizes) * len(args.collective_list) * len(args.sizes))
        with self.progress:
            self._sweep(targets)

    def _sweep(self, targets) -> None:
        for world_size in self.args.world_sizes:
            worlds = {}
            try:
                for name, spec in targets:
                    devices = device_plan(spec, world_size)
                    if isinstance(devices, str):
                        self.unavailable.append({"backend": name, "world_size": world_size, "reason": devices})
                        say(f"# backend {name} world_size={world_size}: unavailable, skipped: {devices}")
                        self.progress.skip(len(self.args.collective_list) * len(self.args.sizes))
                        continue
                    worlds[name] = WorldSlot(spec, world_size, devices, plugins=self.args.backend_plugin,
                                             deadline=self.args.deadline)
                # collectives outer, backends inner: the backends' tables of one
                # collective are measured (and printed) next to each other
                for collective in self.args.collective_records:
                    for name, slot in worlds.items():
                        self._run_collective(name, slot, world_size, collective)
            finally:
                for slot in worlds.values():
                    slot.close()

    def _run_collective(self, name: str, slot: WorldSlot, world_size: int, record: Collective) -> None:
        from fixtures.errors import WorldError
        from suites.stress.rank_bench import bench_row

        args = self.args
        collective = record.bench_name  # what the tables and the JSON call it
        try:
            world = slot.get()  # the live world, reset or replaced after a failure
        except Exception as exc:
            self._error(name, world_size, collective, None, exc)
            self.progress.skip(len(args.sizes))
            return
        say()
        say(table_header(name, world_size, collective, args.dtype))
        previous = None  # (nominal bytes, p50 seconds) of the last row: the next row's estimate
        seen_sizes = set()
        for position, nbytes in enumerate(args.sizes):
            estimate = 0.0 if previous is None else extrapolated_seconds(previous, nbytes)
            if estimate * (args.min_iters + 2) > args.max_seconds_per_size:
                reason = (f"sizes >= {metrics.format_bytes(nbytes)} skipped: about {estimate:.1f} s per "
                          f"operation, over --max-seconds-per-size {args.max_seconds_per_size:g}")
                self.skipped.append({"backend": name, "world_size": world_size, "collective": collective,
                                     "from_size": nbytes, "reason": reason})
                say(f"# {reason}")
                self.progress.skip(len(args.sizes) - position)
                break
            expected = args.target_seconds + (args.min_iters + args.warmup + 2) * estimate
            deadline = args.deadline + 3 * expected
            call_started = time.monotonic()
            self.progress.start(f"{name} ws{world_size} {collective} {metrics.format_bytes(nbytes)}")
            try:
                results = world.run(bench_row, record, nbytes, args.dtype, warmup=args.warmup,
                                    max_iters=args.iters, min_iters=args.min_iters,
                                    target_seconds=args.target_seconds, deadline=deadline)
            except WorldError as exc:
                # RankError (a rank raised), DeadlineExceeded (hang: stacks in the
                # JSON), RankDied: this collective is over for this backend; the
                # world is reset or replaced before the next one.
                self._error(name, world_size, collective, nbytes, exc)
                self.progress.skip(len(args.sizes) - position)
                return
            self.progress.step()
            row = make_record(name, world_size, record, args.dtype, results, wall_s=time.monotonic() - call_started)
            previous = (nbytes, row.p50_us / 1e6)
            if row.size in seen_sizes:  # e.g. 8 B and 16 B both round up to one element per rank
                continue
            seen_sizes.add(row.size)
            self.records.append(row)
            say(table_row(row))


# How far the last row's time is scaled linearly to the next size. Beyond it the estimate is no estimate: a small
# row is latency-bound, and 8 B -> 64 MiB at 36 us gave "about 76.3 s per operation" on an H200 where the operation
# takes well under a millisecond, skipping every large size. Then the row is measured under the deadline instead.
MAX_EXTRAPOLATION = 64


def extrapolated_seconds(previous: tuple[int, float], nbytes: int) -> float:
    """The next row's seconds per operation from the last row's (bytes, seconds): linear in the size within
    MAX_EXTRAPOLATION, else 0.0 (unknown: measure it)."""
    ratio = max(1.0, nbytes / previous[0])
    return previous[1] * ratio if ratio <= MAX_EXTRAPOLATION else 0.0


# ------------------------------------------------------------------ comparison
def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def compare(records: list[CollectiveRow], baseline: str) -> list[dict]:
    """For every other backend: busbw and time ratios to the baseline per (collective, world size, size)."""
    base = {(r.collective, r.world_size, r.size): r for r in records if r.backend == baseline}
    rows = []
    for r in records:
        if r.backend == baseline:
            continue
        b = base.get((r.collective, r.world_size, r.size))
        if b is None:
            continue
        rows.append({
            "backend": r.backend, "baseline": baseline, "collective": r.collective,
            "world_size": r.world_size, "size": r.size,
            "time_us": r.time_us, "baseline_time_us": b.time_us,
            "time_ratio": _ratio(r.time_us, b.time_us),
            "busbw": r.busbw, "baseline_busbw": b.busbw,
            "busbw_ratio": _ratio(r.busbw, b.busbw),
        })
    return rows


def headline(comparison: list[dict], args, unavailable: list[dict]) -> list[dict]:
    """The reference backend's targets against the baseline (figures, never assertions)."""
    candidate = HEADLINE_CANDIDATE
    reasons = {u["backend"]: u["reason"] for u in unavailable if u["world_size"] is None}
    lines = []
    for what, collective, size, sense, target in HEADLINE_TARGETS:
        for world_size in HEADLINE_WORLD_SIZES:
            entry = {"backend": candidate, "baseline": args.baseline, "metric": what, "collective": collective,
                     "size": size, "world_size": world_size, "target": f"{sense} {target:g}x",
                     "ratio": None, "status": "NOT MEASURED", "why": ""}
            match = [c for c in comparison if c["backend"] == candidate and c["collective"] == collective
                     and c["world_size"] == world_size and c["size"] == size]
            if match:
                ratio = match[0]["busbw_ratio" if what == "busbw" else "time_ratio"]
                entry["ratio"] = ratio
                ok = ratio is not None and (ratio >= target if sense == ">=" else ratio <= target)
                entry["status"] = "PASS" if ok else "MISS"
            elif candidate not in args.backends or args.baseline not in args.backends:
                entry["why"] = f"needs --backend {args.baseline},{candidate}"
            elif candidate in reasons or args.baseline in reasons:
                who = candidate if candidate in reasons else args.baseline
                entry["why"] = f"{who} unavailable: {reasons[who]}"
            elif world_size not in args.world_sizes or collective not in args.collective_list \
                    or size not in args.sizes:
                entry["why"] = "world size, collective or size not in this run"
            else:
                entry["why"] = "no result (see the errors)"
            lines.append(entry)
    return lines


def print_comparison(comparison: list[dict]) -> None:
    if not comparison:
        return
    say()
    say("# side by side (ratio = backend / baseline; busbw ratio > 1 and time ratio < 1 favour the backend)")
    head = ("backend", "baseline", "collective", "ws", "size", "time_us", "base_time_us", "time_x",
            "busbw", "base_busbw", "busbw_x")
    widths = (10, 9, 15, 3, 10, 11, 12, 8, 9, 10, 8)
    say("#" + "  ".join(h.rjust(w) for h, w in zip(head, widths))[1:])
    for c in comparison:
        cells = (c["backend"], c["baseline"], c["collective"], c["world_size"], c["size"],
                 f"{c['time_us']:.1f}", f"{c['baseline_time_us']:.1f}",
                 "-" if c["time_ratio"] is None else f"{c['time_ratio']:.2f}",
                 f"{c['busbw']:.3f}", f"{c['baseline_busbw']:.3f}",
                 "-" if c["busbw_ratio"] is None else f"{c['busbw_ratio']:.2f}")
        say("  ".join(str(x).rjust(w) for x, w in zip(cells, widths)))


def print_headline(lines: list[dict]) -> None:
    say()
    say(f"# headline targets: {HEADLINE_CANDIDATE} vs {lines[0]['baseline']} (benchmark figures, not assertions)")
    if all(h["ratio"] is None for h in lines) and len({h["why"] for h in lines}) == 1:
        say(f"#   not measured: {lines[0]['why']}")
        return
    for h in lines:
        label = "busbw" if h["metric"] == "busbw" else "latency (p50)"
        where = f"{h['backend']} {h['collective']} {label} at {metrics.format_bytes(h['size'])}, ws {h['world_size']}"
        if h["ratio"] is not None:
            say(f"#   {where}: {h['ratio']:.2f}x {h['baseline']} (target {h['target']}) {h['status']}")
        else:
            say(f"#   {where}: {h['status']} ({h['why']})")


# ------------------------------------------------------------------ main
def main(argv=None) -> int:
    args = parse_args(argv)
    registry = backend_registry(args.backend_plugin, args.backends)
    if registry is None:
        return 2
    say(f"# distconform collective benchmark: backends {','.join(args.backends)}, world sizes "
        f"{','.join(map(str, args.world_sizes))}, {metrics.format_bytes(args.sizes[0])}..."
        f"{metrics.format_bytes(args.sizes[-1])} x{args.step_factor}, {args.dtype}, up to {args.iters} iterations "
        f"(~{args.target_seconds:g} s per size, at least {args.min_iters}), up to {args.warmup} warm-ups")
    say("# time_us/p99_us: per-iteration p50/p99, max over ranks; algbw = size/time_us; busbw = algbw x "
        "nccl-tests bus factor; #wrong: elements differing from the oracle, summed over ranks")
    started = time.monotonic()
    bench = Bench(args)
    run_until_interrupted(bench.run, registry)
    comparison = compare(bench.records, args.baseline)
    heads = headline(comparison, args, bench.unavailable)
    wrong_total = sum(r.wrong for r in bench.records)
    status = 1 if wrong_total or bench.errors else 0

    print_comparison(comparison)
    print_headline(heads)
    say()
    for r in bench.records:
        if r.wrong:
            say(f"# WRONG: {r.backend} world_size={r.world_size} {r.collective} size {r.size}: "
                f"{r.wrong} wrong elements")
    os.makedirs(args.report_dir, exist_ok=True)
    path = os.path.join(args.report_dir, "collectives.json")
    report = {
        "tool": "suites.stress.collectives",
        "config": {"backends": args.backends, "world_sizes": args.world_sizes,
                   "collectives": args.collective_list, "sizes": args.sizes, "dtype": args.dtype,
                   "step_factor": args.step_factor, "iters": args.iters, "min_iters": args.min_iters,
                   "warmup": args.warmup, "target_seconds": args.target_seconds, "baseline": args.baseline,
                   "backend_plugins": args.backend_plugin, "deadline": args.deadline},
        "host": host_info(),
        "columns": [k for k, _, _ in COLUMNS],
        "records": [r.to_json() for r in bench.records],
        "errors": bench.errors,
        "unavailable": bench.unavailable,
        "skipped": bench.skipped,
        "comparison": comparison,
        "headline": heads,
        "wrong_total": wrong_total,
        "exit_status": status,
        "seconds": time.monotonic() - started,
    }
    with open(path, "w") as fh:
        json.dump(report, fh, indent=1)
    from reports.benchmarks import write_collectives_outputs  # CSV and plots beside the JSON
    from reports.html_report import refresh_report  # the folder's report.html, when it holds a conformance run

    written = write_collectives_outputs(report, args.report_dir) + refresh_report(args.report_dir)
    say(f"# also written: {', '.join(os.path.basename(p) for p in written)}")
    say(f"# {len(bench.records)} rows, {wrong_total} wrong elements, {len(bench.errors)} errors, "
        f"{len(bench.unavailable)} unavailable; {time.monotonic() - started:.1f} s; report: {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
