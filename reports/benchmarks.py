"""The benchmarks' results as files people load elsewhere: CSV and plots.

From ``collectives.json`` (python -m suites.stress.collectives):

* ``collectives.csv``: one row per (backend, world size, collective, size), nccl-tests' columns;
* ``collectives_busbw.png/.svg`` and ``collectives_time.png/.svg``: busbw and time vs size,
  one panel per collective, one line per backend and world size, log-log.

From ``stress.json`` (python -m suites.stress.rpc):

* ``rpc.csv``: one row per (agent, backend, world size, benchmark, mode, profiled);
* ``rpc_rate.png/.svg`` (RPCs per second per agent) and ``rpc_latency.png/.svg`` (sync p50 and
  p99 per agent).

The CSV files have one header row, plain numbers (no units in cells; units are in the
column names) and empty cells for missing values: they load unchanged into a spreadsheet
and ``pandas.read_csv``. Plots use matplotlib (the Agg backend: no display needed).
The records are read as plain dicts by their JSON keys: reports/ imports nothing of the project
(docs/architecture.md, the layers), and a report must survive a hand-edited file; the benchmarks
write those keys from their typed rows (suites/stress/records.py, whose tests check that every
key of the two column tables below is written).
report.html embeds all of this when the JSON files are in its folder; a benchmark that
writes into the folder of a conformance run re-renders its report.html afterwards
(reports/html_report.py:refresh_report; this module knows nothing of the page).

    python -m reports.benchmarks REPORT_DIR     # (re)write CSV and plots from the JSON files there
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from collections import defaultdict

COLLECTIVES_JSON = "collectives.json"
RPC_JSON = "stress.json"

# (CSV column, key in a collectives.json record)
COLLECTIVE_COLUMNS = (
    ("backend", "backend"), ("world_size", "world_size"), ("collective", "collective"),
    ("size_bytes", "size"), ("count", "count"), ("type", "type"), ("redop", "redop"), ("root", "root"),
    ("time_us_p50", "time_us"), ("time_us_p99", "p99_us"), ("algbw_GBps", "algbw"), ("busbw_GBps", "busbw"),
    ("bus_factor", "bus_factor"), ("wrong", "#wrong"), ("iters", "iters"), ("warmup", "warmup"),
)
RPC_COLUMNS = (
    ("agent", "agent"), ("backend", "backend"), ("world_size", "world_size"), ("benchmark", "benchmark"),
    ("mode", "mode"), ("profiled", "profiled"), ("calls", "calls"), ("rpcs_per_s", "rpcs_per_s"),
    ("latency_us_p50", "p50_us"), ("latency_us_p99", "p99_us"), ("seconds", "seconds"),
    ("x_tensorpipe", "x_tensorpipe"), ("wrong", "wrong"),
)


def load(path: str) -> dict | None:
    """A benchmark JSON file, or None when it is absent or not one (a report must not fail on it)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        return None
    data["records"] = [r for r in data["records"] if isinstance(r, dict)]
    return data


def _value(value):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def write_csv(path: str, records, columns) -> str:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([name for name, _ in columns])
        for record in records:
            writer.writerow([_value(record.get(key)) for _, key in columns])
    return path


# --------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable SVG
    matplotlib.rcParams["svg.hashsalt"] = "distconform"  # the same data gives the same file
    import matplotlib.pyplot as plt

    return plt


def _save(fig, base: str) -> list[str]:
    paths = []
    for ext in ("png", "svg"):
        path = f"{base}.{ext}"
        fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
        paths.append(path)
    return paths


def _ws(record: dict):
    """A record's world size as a dict key (a hand-edited file may hold anything there)."""
    ws = record.get("world_size")
    return ws if isinstance(ws, int) else str(ws)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def collective_plots(records, folder: str) -> list[str]:
    """busbw and time vs size per collective, a line per (backend, world size), log-log."""
    plt = _pyplot()
    collectives = sorted({r.get("collective") for r in records if isinstance(r.get("collective"), str)})
    if not collectives:
        return []
    paths = []
    for metric, key, label in (("busbw", "busbw", "busbw (GB/s)"), ("time", "time_us", "time p50 (µs)")):
        columns = min(3, len(collectives))
        rows = math.ceil(len(collectives) / columns)
        fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.3 * rows), squeeze=False,
                                 layout="constrained")
        for ax, collective in zip(axes.flat, collectives):
            lines = defaultdict(list)
            for r in records:
                if r.get("collective") == collective and _positive(r.get("size")) and _positive(r.get(key)):
                    lines[(str(r.get("backend")), _ws(r))].append((r["size"], r[key]))
            for (backend, ws), points in sorted(lines.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
                points.sort()
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                        label=f"{backend} ws{ws}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(collective)
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            if lines:
                ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(collectives):]:
            ax.set_visible(False)
        fig.suptitle(f"collectives: {label} vs size")
        paths += _save(fig, os.path.join(folder, f"collectives_{metric}"))
        plt.close(fig)
    return paths


def rpc_plots(records, folder: str) -> list[str]:
    """RPC rate per agent for each (benchmark, mode, profiled); sync latency p50/p99 per agent."""
    plt = _pyplot()
    agents = sorted({str(r.get("agent")) for r in records})
    if not agents:
        return []
    paths = []
    groups = sorted({(str(r.get("benchmark")), str(r.get("mode")), bool(r.get("profiled")), _ws(r),
                      str(r.get("backend"))) for r in records}, key=str)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(groups) * len(agents) / 2), 3.6), layout="constrained")
    width = 0.8 / len(agents)
    for i, agent in enumerate(agents):
        heights = []
        for g in groups:
            match = [r for r in records if str(r.get("agent")) == agent and (str(r.get("benchmark")), str(r.get("mode")),
                     bool(r.get("profiled")), _ws(r), str(r.get("backend"))) == g]
            value = match[0].get("rpcs_per_s") if match else None
            heights.append(value if _positive(value) else 0)
        ax.bar([x + i * width for x in range(len(groups))], heights, width, label=agent)
    ax.set_xticks([x + width * (len(agents) - 1) / 2 for x in range(len(groups))])
    ax.set_xticklabels([f"{b} {m}{' prof' if p else ''}\n{be} ws{ws}" for b, m, p, ws, be in groups], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("RPCs per second (per rank)")
    ax.set_title("RPC rate per agent")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    paths += _save(fig, os.path.join(folder, "rpc_rate"))
    plt.close(fig)

    sync = [r for r in records if r.get("mode") == "sync" and _positive(r.get("p50_us"))]
    if sync:
        labels = [f"{r.get('agent')}\n{r.get('benchmark')}{' prof' if r.get('profiled') else ''} ws{r.get('world_size')}"
                  for r in sync]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(sync)), 3.6), layout="constrained")
        xs = range(len(sync))
        ax.bar([x - 0.2 for x in xs], [r["p50_us"] for r in sync], 0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [r["p99_us"] if _positive(r.get("p99_us")) else 0 for r in sync], 0.4,
               label="p99")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("latency per call (µs)")
        ax.set_title("RPC sync latency percentiles per agent")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
        paths += _save(fig, os.path.join(folder, "rpc_latency"))
        plt.close(fig)
    return paths


# --------------------------------------------------------------- for the HTML
def collectives_summary(records) -> list[dict]:
    """Per (backend, world size, collective): the smallest size's p50 time and the peak busbw."""
    groups = defaultdict(list)
    for r in records:
        if _positive(r.get("size")):
            groups[(str(r.get("backend")), _ws(r), str(r.get("collective")))].append(r)
    out = []
    for (backend, ws, collective), rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        rows.sort(key=lambda r: r["size"])
        peak = max((r for r in rows if _positive(r.get("busbw"))), key=lambda r: r["busbw"], default=None)
        out.append({"backend": backend, "world_size": ws, "collective": collective, "sizes": len(rows),
                    "small_size": rows[0]["size"], "small_time_us": rows[0].get("time_us"),
                    "peak_busbw": peak and peak["busbw"], "peak_size": peak and peak["size"],
                    "wrong": sum(r.get("#wrong") or 0 for r in rows if isinstance(r.get("#wrong"), int))})
    return out


def figures(folder: str, names, newer_than: float) -> list[tuple[str, str]]:
    """[(name, data URI)] of the SVG plots in ``folder`` written after their JSON (self-contained embedding)."""
    import base64

    out = []
    for name in names:
        path = os.path.join(folder, f"{name}.svg")
        if os.path.exists(path) and os.path.getmtime(path) >= newer_than:
            with open(path, "rb") as fh:
                out.append((name, "data:image/svg+xml;base64," + base64.b64encode(fh.read()).decode()))
    return out


# ---------------------------------------------------------------------- entry
def _plots(plot, records, folder: str) -> list[str]:
    """The plots, or none with a note when matplotlib is missing (the CSV is still written)."""
    try:
        return plot(records, folder)
    except ImportError as exc:
        print(f"# plots not written: {exc} (pip install -r requirements.txt)", file=sys.stderr)
        return []


def write_collectives_outputs(report: dict, folder: str) -> list[str]:
    """collectives.csv and the busbw/time plots beside collectives.json; the paths written (the benchmark
    then refreshes report.html: reports/html_report.py:refresh_report)."""
    records = [r for r in report.get("records", []) if isinstance(r, dict)]
    return [write_csv(os.path.join(folder, "collectives.csv"), records, COLLECTIVE_COLUMNS)] + \
        _plots(collective_plots, records, folder)


def write_rpc_outputs(report: dict, folder: str) -> list[str]:
    """rpc.csv and the rate/latency plots beside stress.json; the paths written."""
    records = [r for r in report.get("records", []) if isinstance(r, dict)]
    return [write_csv(os.path.join(folder, "rpc.csv"), records, RPC_COLUMNS)] + \
        _plots(rpc_plots, records, folder)


def write_outputs(folder: str) -> list[str]:
    """CSV and plots for every benchmark JSON file in ``folder``."""
    written = []
    collectives = load(os.path.join(folder, COLLECTIVES_JSON))
    if collectives is not None:
        written += write_collectives_outputs(collectives, folder)
    rpc = load(os.path.join(folder, RPC_JSON))
    if rpc is not None:
        written += write_rpc_outputs(rpc, folder)
    return written


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m reports.benchmarks REPORT_DIR  (writes CSV and plots from collectives.json "
              "and stress.json there)", file=sys.stderr)
        return 2
    written = write_outputs(argv[0])
    if not written:
        print(f"reports.benchmarks: no readable {COLLECTIVES_JSON} or {RPC_JSON} in {argv[0]}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
