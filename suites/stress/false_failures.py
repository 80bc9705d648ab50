"""The suite's own false-failure rate: the default run K times from one clone, every verdict aggregated.

    python -m suites.stress.false_failures --runs 20                 # 20 consecutive default runs
    python -m suites.stress.false_failures --runs 5 --busy 2         # beside two processes spinning on a core each
    python -m suites.stress.false_failures --runs 3 --keep out/ -- --backend gloo,reference

Each run is ``python -m pytest suites/ [-- extra]`` in this interpreter
(suites/stress/suite_speed.py's runner), into a report folder of its own, one
after the other. ``--busy N`` starts N ``sh -c 'while :; do :; done'``
processes for the whole measurement, the load the issue's bar names. The
code under test does not change between runs, so every case whose verdict
differs between runs, and every failure, is a defect of the suite (or of
torch under it) to fix at its cause.

Printed: one line per run (exit status, wall time, counts per outcome), then
every case that failed in any run with its failing runs and causes, then
every case whose outcome varied (xfailed in one run, xpassed in another:
an intermittent gap shows here too), and a last line
``false failures: F of K runs failed`` that a CI log can be searched for.
``--json FILE`` writes the same as data. Exit status 1 when any run failed
(a varied outcome that never failed, such as an intermittent gap, is shown
but does not fail it), else 0; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass

from suites.stress.suite_speed import Measured, run_suite, split_pytest_args

FAILING = frozenset({"failed", "error"})


@dataclass(frozen=True)
class CaseHistory:
    """One case's outcomes over the runs, in run order ('' where a run did not have the case)."""

    nodeid: str
    outcomes: tuple[str, ...]
    causes: tuple[str, ...]  # the cause of each failing run's failure, in run order

    @property
    def failed_in(self) -> list[int]:
        return [i + 1 for i, outcome in enumerate(self.outcomes) if outcome in FAILING]

    @property
    def varied(self) -> bool:
        return len({o for o in self.outcomes if o}) > 1


def histories(runs: list[Measured]) -> list[CaseHistory]:
    outcomes: dict[str, list[str]] = defaultdict(lambda: [""] * len(runs))
    causes: dict[str, list[str]] = defaultdict(list)
    for i, run in enumerate(runs):
        for record in run.records:
            outcomes[record.nodeid][i] = record.outcome
            if record.outcome in FAILING:
                causes[record.nodeid].append((record.cause or record.error).splitlines()[0] if
                                             (record.cause or record.error) else "(no error text)")
    return [CaseHistory(nodeid, tuple(o), tuple(causes.get(nodeid, ()))) for nodeid, o in sorted(outcomes.items())]


def run_line(i: int, run: Measured) -> str:
    counts = Counter(r.outcome for r in run.records)
    shown = ", ".join(f"{counts[o]} {o}" for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
                      if counts[o])
    return f"run {i:2d}: exit {run.exit_status}, {run.wall_s:6.1f} s, {len(run.records)} cases: {shown}"


def aggregate(runs: list[Measured]) -> dict:
    cases = histories(runs)
    failed = [c for c in cases if c.failed_in]
    varied = [c for c in cases if c.varied and not c.failed_in]
    return {
        "runs": [{"exit_status": r.exit_status, "wall_s": round(r.wall_s, 1),
                  "outcomes": dict(Counter(rec.outcome for rec in r.records))} for r in runs],
        "failed_runs": sum(1 for r in runs if r.exit_status != 0),
        "failures": [{"nodeid": c.nodeid, "failed_in": c.failed_in, "causes": list(c.causes)} for c in failed],
        "varied": [{"nodeid": c.nodeid, "outcomes": dict(Counter(o for o in c.outcomes if o))} for c in varied],
    }


def render(runs: list[Measured], summary: dict) -> str:
    lines = [run_line(i + 1, run) for i, run in enumerate(runs)]
    if summary["failures"]:
        lines += ["", "cases that failed (runs, causes):"]
        lines += [f"  {f['nodeid']}: runs {f['failed_in']}: " + " | ".join(sorted(set(f["causes"])))[:400]
                  for f in summary["failures"]]
    if summary["varied"]:
        lines += ["", "cases whose outcome varied without failing:"]
        lines += [f"  {v['nodeid']}: {v['outcomes']}" for v in summary["varied"]]
    walls = [r.wall_s for r in runs]
    lines += ["", f"wall time per run: min {min(walls):.1f} s, max {max(walls):.1f} s",
              f"false failures: {summary['failed_runs']} of {len(runs)} runs failed, "
              f"{len(summary['failures'])} cases failed, {len(summary['varied'])} more varied"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_pytest_args(argv)
    parser = argparse.ArgumentParser(prog="python -m suites.stress.false_failures",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="how many default runs, one after the other")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core each, for every run")
    parser.add_argument("--keep", metavar="DIR", help="keep each run's report under DIR/run-N (default: a temp dir)")
    parser.add_argument("--json", metavar="FILE", help="write the aggregate as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.busy < 0:
        parser.error("--runs must be at least 1 and --busy at least 0")
    base = args.keep or tempfile.mkdtemp(prefix="distconform-false-failures-")
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.busy)]
    runs: list[Measured] = []
    try:
        for i in range(1, args.runs + 1):
            runs.append(run_suite(f"run {i}", extra, os.path.join(base, f"run-{i}")))
    finally:
        for proc in busy:
            proc.kill()
    summary = aggregate(runs)
    print()
    print(render(runs, summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if summary["failed_runs"] or summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
