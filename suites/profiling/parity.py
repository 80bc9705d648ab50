"""Parity of profiles: what is compared, TensorPipe's baseline, the report files.

An event is compared as (name, node id, input shapes); a profile as the
multiset of those (times and thread ids excluded). The baseline is
TensorPipe's, taken in a world of its own (TensorPipe starts once per
process, and it does not use the c10d backend under test).

TensorPipe's baseline runs on an agent with many worker threads: torch
2.13's TensorPipe profiles only the first profiled request of each worker
thread (suites/profiling/conftest.py). A single TensorPipe profile is not
the baseline: under load TensorPipe adds events of its own machinery to
some profiles (measured, call_self under two busy processes: aten::empty x2
and aten::set_ at the caller's node in 2 of 10 profiles, while it unpacks
the response) and a timing race can lose events. So the baseline of a
workload is, per event, the counts TensorPipe produced over SAMPLES profiles
(an event missing from a profile counts 0 there). An event TensorPipe
recorded the same number of times in every profile must be matched exactly
by every agent (one run after a warm-up); an event whose count varied between
TensorPipe's own profiles is a timing artefact of TensorPipe's threads, not
part of what an RPC records, so an agent may record it anywhere from 0 to
TensorPipe's largest count (CI under load, three pytest workers: aten::empty
x2 and aten::set_ of call_self async in most of five TensorPipe profiles, so
a median baseline of them failed an agent that never records them). The
median is what the report shows.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

SAMPLES = 5  # odd: the median is a count TensorPipe itself produced


def event_key(evt: dict) -> tuple:
    return (evt["name"], evt["node_id"], json.dumps(evt["input_shapes"]))


def multiset(events: list[dict]) -> Counter:
    return Counter(event_key(e) for e in events)


def rows(counts: Counter) -> list[dict]:
    return [{"name": name, "node_id": node, "input_shapes": json.loads(shapes), "count": n}
            for (name, node, shapes), n in sorted(counts.items())]


@dataclass
class Baseline:
    """TensorPipe's counts of each event over its samples: the median (shown), and what an agent may record."""

    median: Counter
    allowed: dict  # event key -> (least, most) count an agent may record

    def accepts(self, key: tuple, count: int) -> bool:
        least, most = self.allowed.get(key, (0, 0))
        return least <= count <= most


def median_baseline(sample) -> tuple[Baseline, int]:
    """TensorPipe's baseline over SAMPLES calls of ``sample()``; (baseline, samples). A count every sample agrees
    on is exact; one that varied between samples allows 0 to its largest value (the module docstring says why)."""
    samples = [sample() for _ in range(SAMPLES)]
    median: Counter = Counter()
    allowed = {}
    for key in set().union(*samples):
        counts = sorted(s[key] for s in samples)
        if counts[SAMPLES // 2]:
            median[key] = counts[SAMPLES // 2]
        allowed[key] = (counts[0], counts[0]) if counts[0] == counts[-1] else (0, counts[-1])
    return Baseline(median, allowed), SAMPLES


@dataclass
class Difference:
    name: str
    node_id: int
    input_shapes: list
    expected: int  # TensorPipe's count
    actual: int  # the agent's count

    def line(self) -> str:
        return (f"{self.name!r} node {self.node_id} shapes {self.input_shapes}: "
                f"tensorpipe {self.expected}, agent {self.actual}")


def compare(expected: Baseline, actual: Counter) -> list[Difference]:
    diffs = []
    for key in sorted(set(expected.allowed) | set(actual)):
        if not expected.accepts(key, actual[key]):
            name, node, shapes = key
            diffs.append(Difference(name, node, json.loads(shapes), expected.median[key], actual[key]))
    return diffs


# ------------------------------------------------------------------ report
@dataclass
class ParityRow:
    target: str  # backend-wsN
    agent: str
    workload: str
    mode: str
    match: bool
    baseline_samples: int
    differences: list = field(default_factory=list)  # Difference.line() texts
    known_deviation: str = ""  # why the agent knowingly differs (its gap in backends/rpc_agents.py)

    def to_json(self) -> dict:
        return self.__dict__.copy()


def rows_dir(report_dir: str, run_id: str) -> str:
    """Rows of one pytest run (xdist workers share the run id), one file per case."""
    return os.path.join(report_dir, "profiling", "parity-rows", run_id)


def write_row(report_dir: str, run_id: str, row: ParityRow) -> None:
    """One file per case, so pytest-xdist workers never write the same file."""
    folder = rows_dir(report_dir, run_id)
    os.makedirs(folder, exist_ok=True)
    name = f"{row.target}__{row.agent}__{row.workload}__{row.mode}.json"
    with open(os.path.join(folder, name), "w") as f:
        json.dump(row.to_json(), f, indent=1)


def load_rows(report_dir: str, run_id: str) -> list[dict]:
    folder = rows_dir(report_dir, run_id)
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                out.append(json.load(f))
    return out


def markdown(rows_: list[dict]) -> str:
    """Per agent: a table of workloads x modes (match or how many events differ), then the differences."""
    lines = ["# Remote profiling parity with TensorPipe", "",
             "Each cell: the multiset of (event name, node id, input shapes) of one profiled workload "
             "compared with TensorPipe's (each event's median count over its samples).", ""]
    by_agent: dict[tuple, list[dict]] = {}
    for row in rows_:
        by_agent.setdefault((row["agent"], row["target"]), []).append(row)
    for (agent, target), group in sorted(by_agent.items()):
        modes = sorted({r["mode"] for r in group}, key=["sync", "async", "remote"].index)
        lines += [f"## {agent} ({target})", "", "| workload | " + " | ".join(modes) + " |",
                  "|---|" + "---|" * len(modes)]
        cells: dict[tuple, str] = {}
        for r in group:
            if r["match"]:
                cells[r["workload"], r["mode"]] = "match"
            elif r.get("known_deviation"):
                cells[r["workload"], r["mode"]] = f"{len(r['differences'])} differ (known deviation)"
            else:
                cells[r["workload"], r["mode"]] = f"**{len(r['differences'])} differ**"
        for workload in sorted({r["workload"] for r in group}):
            lines.append(f"| {workload} | " + " | ".join(cells.get((workload, m), "-") for m in modes) + " |")
        lines.append("")
        for r in group:
            if not r["match"]:
                lines.append(f"### {agent}: {r['workload']} {r['mode']}")
                if r.get("known_deviation"):
                    lines.append(f"Known deviation: {r['known_deviation']}")
                lines += [f"- {d}" for d in r["differences"]]
                lines.append("")
    return "\n".join(lines) + "\n"


def _replace(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # atomic: xdist workers may each rewrite the summary


def write_summary(report_dir: str, run_id: str) -> str | None:
    """parity.md and parity.json from this run's rows (every process calls it at its end)."""
    rows_ = load_rows(report_dir, run_id)
    if not rows_:
        return None
    folder = os.path.join(report_dir, "profiling")
    _replace(os.path.join(folder, "parity.json"), json.dumps(rows_, indent=1))
    path = os.path.join(folder, "parity.md")
    _replace(path, markdown(rows_))
    return path


# ------------------------------------------------------------ chrome trace
def check_chrome_trace(trace) -> list[str]:
    """Problems that would stop Perfetto / chrome://tracing loading ``trace`` (empty: none).

    torch's legacy profiler writes Chrome's JSON Array Format; the JSON Object
    Format ({"traceEvents": [...]}) is accepted as well.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list) or not events:
        return ["no trace events (neither a JSON array nor an object with a traceEvents list)"]
    problems = []
    for i, evt in enumerate(events):
        if not isinstance(evt, dict):
            problems.append(f"event {i} is not an object")
            continue
        for key in ("name", "ph", "ts", "pid", "tid"):
            if key not in evt:
                problems.append(f"event {i} ({evt.get('name')!r}) has no {key!r}")
        if evt.get("ph") == "X" and not (isinstance(evt.get("dur"), (int, float)) and evt["dur"] >= 0):
            problems.append(f"complete event {i} ({evt.get('name')!r}) has no duration >= 0")
        if not isinstance(evt.get("ts", 0), (int, float)):
            problems.append(f"event {i} has a non-numeric ts")
    return problems
