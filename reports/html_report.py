"""report.html: one self-contained page for a browser (no network, no CDN: it opens from a CI artifact).

Rendered with Jinja2 (templates/report.html.j2, autoescaped: error texts and
findings are backend output and may hold anything) from the same views as
summary.md (reports/views.py). Profiling parity (profiling/parity.json) and
chrome traces are picked up from the report folder when this run wrote them.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

from . import benchmarks, views
from .fault_figures import fault_figures
from .json_report import read_json
from .rendering import environment


# ----------------------------------------------------------------- profiling
def _profiling(records, out_dir: str, started: float) -> dict | None:
    """Parity rows and chrome traces written by this run (files older than the run are not shown)."""
    if not any(r.area == "profiling" for r in records):
        return None
    folder = os.path.join(out_dir, "profiling")
    fresh = lambda path: os.path.exists(path) and os.path.getmtime(path) >= started - 1  # noqa: E731
    tables = []
    parity_path = os.path.join(folder, "parity.json")
    if fresh(parity_path):
        try:
            with open(parity_path) as fh:
                rows = json.load(fh)
        except (OSError, ValueError) as exc:
            rows, tables = [], [{"title": "parity.json", "error": f"unreadable: {exc}"}]
        grouped: dict = defaultdict(list)
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict):
                grouped[(row.get("agent", "?"), row.get("target", "?"))].append(row)
        for (agent, target_), group in sorted(grouped.items()):
            modes = sorted({row.get("mode", "?") for row in group})
            cells: dict = {}
            for row in group:
                cells[(row.get("workload", "?"), row.get("mode", "?"))] = row
            tables.append({"title": f"{agent} ({target_})", "modes": modes,
                           "workloads": sorted({w for w, _ in cells}), "cells": cells, "error": ""})
    traces = sorted(name for name in (os.listdir(folder) if os.path.isdir(folder) else ())
                    if name.startswith("trace_") and name.endswith(".json") and fresh(os.path.join(folder, name)))
    return {"tables": tables, "traces": [f"profiling/{name}" for name in traces],
            "has_markdown": fresh(os.path.join(folder, "parity.md"))}


# ---------------------------------------------------------------- benchmarks
def _benchmarks(out_dir: str) -> dict | None:
    """The benchmark results in the report folder (python -m suites.stress.collectives / .rpc), if any."""
    found = {}
    for kind, name, plots in (("collectives", benchmarks.COLLECTIVES_JSON, ("collectives_busbw", "collectives_time")),
                              ("rpc", benchmarks.RPC_JSON, ("rpc_rate", "rpc_latency"))):
        path = os.path.join(out_dir, name)
        data = benchmarks.load(path)
        if data is None:
            continue
        written = os.path.getmtime(path)
        csv_name = "collectives.csv" if kind == "collectives" else "rpc.csv"
        found[kind] = {
            "file": name, "written": _utc(written), "command": str(data.get("command", "")),
            "host": data.get("host") if isinstance(data.get("host"), dict) else {},
            "records": data["records"], "errors": _dicts(data.get("errors")),
            "unavailable": _dicts(data.get("unavailable")), "headline": _dicts(data.get("headline")),
            "summary": benchmarks.collectives_summary(data["records"]) if kind == "collectives" else [],
            "figures": benchmarks.figures(out_dir, plots, written - 1),
            "csv": csv_name if os.path.exists(os.path.join(out_dir, csv_name)) else "",
        }
    return found or None


def _dicts(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _utc(timestamp: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")


# -------------------------------------------------------------------- render
def _displayable(meta) -> dict:
    """meta as the template reads it: the grouped facts are mappings even in a hand-edited file."""
    meta = dict(meta) if isinstance(meta, dict) else {}
    for name in ("host", "env", "packages", "plugin_packages"):
        if not isinstance(meta.get(name), dict):
            meta[name] = {}
    if not isinstance(meta.get("plugins"), list):
        meta["plugins"] = [str(meta["plugins"])] if meta.get("plugins") else []
    return meta


def context(records, meta: dict, *, out_dir: str = "", started: float = 0.0) -> dict:
    records = sorted(records, key=lambda r: r.nodeid)
    targets, areas, cells = views.matrix(records)
    figures, figure_problems = fault_figures(records)
    by_target_area: dict = defaultdict(list)
    for r in records:
        by_target_area[(views.target(r), r.area or "-")].append(r)
    return {
        "meta": _displayable(meta),
        "records": records,
        "totals": views.totals(records),
        "targets": targets,
        "areas": areas,
        "matrix": cells,
        "cases_by_target_area": sorted(by_target_area.items()),
        "contract": views.contract_view(records),
        "causes": views.failures_by_cause(records),
        "failing": views.failures(records),
        "stability": views.stability(records),
        "gaps": views.gaps(records),
        "skips": views.skips(records),
        "findings": views.findings_by_clause(records),
        "faults": figures,
        "fault_problems": figure_problems,
        "slowest": views.slowest(records, 20),
        "area_times": views.durations_by_area(records),
        "slowest_clauses": views.slowest_clauses(records),
        "total_time": sum(r.duration for r in records),
        "profiling": _profiling(records, out_dir, started) if out_dir else None,
        "benchmarks": _benchmarks(out_dir) if out_dir else None,
    }


def render(records, meta: dict, *, out_dir: str = "", started: float = 0.0) -> str:
    template = environment().get_template("report.html.j2")
    return template.render(**context(records, meta, out_dir=out_dir, started=started))


def write_html(path: str, records, meta: dict, *, started: float = 0.0) -> None:
    text = render(records, meta, out_dir=os.path.dirname(os.path.abspath(path)), started=started)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def rerender(folder: str) -> str:
    """Re-render ``folder``/report.html from its conformance.json (so the page embeds the benchmark
    results written there since); its path. ValueError naming the problem when there is no readable one."""
    records, meta = read_json(os.path.join(folder, "conformance.json"))
    path = os.path.join(folder, "report.html")
    write_html(path, records, meta)
    return path


def refresh_report(folder: str) -> list[str]:
    """After a benchmark wrote into ``folder``: [report.html re-rendered] when the folder holds a
    conformance run, else [] (with a note when its conformance.json is unreadable)."""
    if not os.path.exists(os.path.join(folder, "conformance.json")):
        return []
    try:
        return [rerender(folder)]
    except ValueError as exc:
        print(f"# report.html not refreshed: {exc}", file=sys.stderr)
        return []


def main(argv=None) -> int:
    """python -m reports.html_report DIR: re-render DIR/report.html from DIR/conformance.json (e.g. after a
    benchmark wrote its results into DIR, so the page embeds them)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m reports.html_report REPORT_DIR", file=sys.stderr)
        return 2
    try:
        print(rerender(argv[0]))
    except ValueError as exc:
        print(f"reports.html_report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
