"""A benchmark of the conformance suite itself: cases/s per area and the slowest clauses, runs side by side.

    python -m suites.stress.suite_speed                                  # the default run: pytest suites/
    python -m suites.stress.suite_speed --run "one process=-n 0" --run "default="
    python -m suites.stress.suite_speed --report before=old/report --report after=reports/out
    python -m suites.stress.suite_speed --run "default=" -- --backend gloo,reference --world-size 2

Each ``--run LABEL=ARGS`` runs ``python -m pytest suites/ ARGS [-- extra]`` in
this interpreter, into a report folder of its own, one after the other;
each ``--report LABEL=PATH`` reads a report already written (a folder with a
conformance.json, or the file). The table gives, per area and per run, the
cases, the sum of their durations, cases per second of that sum, and at the
bottom each run's wall time and cases per second of wall time (the figure
the speed budget is about: with pytest-xdist workers cases overlap, so the
sum exceeds the wall time). Then each run's ten slowest clauses. The rows
come from reports/views.py, the same grouping summary.md shows.

Exit status: 0, or 1 when a run's pytest failed (its table still prints),
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

from reports import views
from reports.json_report import read_json

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Measured:
    label: str
    records: list
    wall_s: float
    exit_status: int = 0
    by_area: dict = field(default_factory=dict)  # area -> (cases, summed seconds)

    def __post_init__(self) -> None:
        sums: dict = defaultdict(lambda: [0, 0.0])
        for r in self.records:
            sums[r.area or "-"][0] += 1
            sums[r.area or "-"][1] += r.duration
        self.by_area = {area: (n, s) for area, (n, s) in sums.items()}


def labelled(text: str, option: str) -> tuple[str, str]:
    label, sep, value = text.partition("=")
    if not sep or not label.strip():
        raise argparse.ArgumentTypeError(f"{option} {text!r}: expected LABEL=VALUE")
    return label.strip(), value.strip()


def run_suite(label: str, args: list[str], report_dir: str) -> Measured:
    cmd = [sys.executable, "-m", "pytest", "suites/", "-q", "-p", "no:cacheprovider", "--report-dir", report_dir,
           *args]
    print(f"[{label}] {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - started
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    print(f"[{label}] exit {proc.returncode} after {wall:.1f} s: {tail[0]}", flush=True)
    path = os.path.join(report_dir, "conformance.json")
    if not os.path.exists(path):
        raise SystemExit(f"[{label}] pytest wrote no {path}; its output ends:\n{proc.stdout[-3000:]}")
    records, _ = read_json(path)
    return Measured(label, records, wall, proc.returncode)


def read_report(label: str, path: str) -> Measured:
    file = os.path.join(path, "conformance.json") if os.path.isdir(path) else path
    records, meta = read_json(file)
    wall = float(meta.get("wall_seconds") or sum(r.duration for r in records))
    return Measured(label, records, wall, int(meta.get("exit_status") or 0))


def table(runs: list[Measured]) -> str:
    areas = sorted({a for m in runs for a in m.by_area}, key=lambda a: -max(m.by_area.get(a, (0, 0))[1] for m in runs))
    head = ["area"] + [f"{m.label}: {col}" for m in runs for col in ("cases", "seconds", "cases/s")]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for area in areas:
        cells = [area]
        for m in runs:
            n, s = m.by_area.get(area, (0, 0.0))
            cells += [str(n), f"{s:.1f}", f"{n / s:.1f}" if s else "-"]
        lines.append(" | ".join(cells))
    summed = ["sum of case durations"]
    wall = ["wall time"]
    for m in runs:
        n, s = len(m.records), sum(r.duration for r in m.records)
        summed += [str(n), f"{s:.1f}", f"{n / s:.1f}" if s else "-"]
        wall += [str(n), f"{m.wall_s:.1f}", f"{n / m.wall_s:.1f}" if m.wall_s else "-"]
    lines += [" | ".join(summed), " | ".join(wall)]
    return "\n".join(lines)


def slowest(m: Measured, n: int = 10) -> str:
    lines = [f"{m.label}: the {n} slowest clauses (seconds, cases, clause, slowest case)"]
    for c in views.slowest_clauses(m.records, n):
        lines.append(f"  {c.total:7.1f} s {c.cases:5d}  {c.function}  "
                     f"(slowest {views.case_id(c.slowest.nodeid)} {c.slowest.duration:.2f} s)")
    return "\n".join(lines)


def split_pytest_args(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(this command's arguments, the pytest arguments after ``--``) of ``argv`` (default: sys.argv)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_pytest_args(argv)
    parser = argparse.ArgumentParser(prog="python -m suites.stress.suite_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", default=[], metavar="LABEL=ARGS",
                        type=lambda t: labelled(t, "--run"),
                        help="run `pytest suites/ ARGS` (shell words; empty: the default run); repeatable")
    parser.add_argument("--report", action="append", default=[], metavar="LABEL=PATH",
                        type=lambda t: labelled(t, "--report"),
                        help="read a report already written (folder or conformance.json); repeatable")
    parser.add_argument("--keep", metavar="DIR", help="keep each run's report under DIR/LABEL (default: a temp dir)")
    args = parser.parse_args(argv)
    runs = args.run or ([] if args.report else [("default", "")])
    measured: list[Measured] = []
    try:
        for label, path in args.report:
            measured.append(read_report(label, path))
    except ValueError as exc:
        parser.error(str(exc))
    base = args.keep or tempfile.mkdtemp(prefix="distconform-suite-speed-")
    for label, words in runs:
        measured.append(run_suite(label, [*shlex.split(words), *extra], os.path.join(base, label.replace(" ", "_"))))
    print()
    print(table(measured))
    for m in measured:
        print()
        print(slowest(m))
    return 1 if any(m.exit_status not in (0,) for m in measured) else 0


if __name__ == "__main__":
    sys.exit(main())
