"""Benchmark results as CSV and plots (reports/benchmarks.py), and embedded in report.html."""

import csv
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from reports import benchmarks
from reports.html_report import render
from tests.harness_cases.procs import REPO_ROOT


def collective_record(backend, ws, collective, size, time_us, busbw, wrong=0):
    return {"backend": backend, "world_size": ws, "collective": collective, "size": size, "count": size // 4,
            "type": "float32", "redop": "sum", "root": -1, "time_us": time_us, "p50_us": time_us,
            "p99_us": time_us * 2, "algbw": busbw, "busbw": busbw, "bus_factor": 1.0, "#wrong": wrong,
            "iters": 10, "warmup": 2}


COLLECTIVES = {"tool": "suites.stress.collectives", "host": {"cpus": 2, "torch": "2.13.0"}, "records": [
    collective_record(b, 2, c, size, 100.0 * (1 + size / 4096), size / (100.0 * (1 + size / 4096)) / 1e3)
    for b in ("gloo", "reference") for c in ("all_reduce", "broadcast") for size in (8, 1024, 65536)],
    "errors": [], "unavailable": [{"backend": "nccl", "world_size": None, "reason": "no GPU"}]}
RPC = {"tool": "suites.stress.rpc", "command": "python -m suites.stress.rpc", "records": [
    {"agent": agent, "backend": "gloo", "world_size": 4, "benchmark": "light", "mode": mode, "profiled": False,
     "calls": 1000, "rpcs_per_s": rate, "p50_us": 50.0 if mode == "sync" else None,
     "p99_us": 90.0 if mode == "sync" else None, "seconds": 1000 / rate, "x_tensorpipe": rate / 2000, "wrong": 0}
    for agent, rate in (("tensorpipe", 2000.0), ("reference-tp", 9000.0)) for mode in ("async", "sync")]}


def test_csv_files_have_one_header_and_plain_numbers(tmp_path):
    path = benchmarks.write_csv(str(tmp_path / "c.csv"), COLLECTIVES["records"], benchmarks.COLLECTIVE_COLUMNS)
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == [name for name, _ in benchmarks.COLLECTIVE_COLUMNS]
    assert len(rows) == len(COLLECTIVES["records"])
    assert rows[0]["backend"] == "gloo" and int(rows[0]["size_bytes"]) == 8 and float(rows[0]["busbw_GBps"]) > 0
    rpc = benchmarks.write_csv(str(tmp_path / "r.csv"), RPC["records"], benchmarks.RPC_COLUMNS)
    with open(rpc, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["latency_us_p50"] == "" and rows[1]["latency_us_p50"] == "50.0"  # missing is an empty cell
    assert rows[0]["profiled"] == "false"


@pytest.fixture(scope="module")
def written_folder(tmp_path_factory):
    """COLLECTIVES and RPC with their CSV and plots written beside them, once for the two tests below (each figure
    is drawn twice, PNG and SVG: most of their CPU); the paths write_outputs returned."""
    folder = tmp_path_factory.mktemp("benchmarks")
    (folder / "collectives.json").write_text(json.dumps(COLLECTIVES))
    (folder / "stress.json").write_text(json.dumps(RPC))
    return folder, benchmarks.write_outputs(str(folder))


def test_plots_are_written_as_png_and_svg(written_folder):
    folder, paths = written_folder
    written = {os.path.basename(p) for p in paths}
    assert written == {"collectives.csv", "collectives_busbw.png", "collectives_busbw.svg", "collectives_time.png",
                       "collectives_time.svg", "rpc.csv", "rpc_rate.png", "rpc_rate.svg", "rpc_latency.png",
                       "rpc_latency.svg"}
    assert (folder / "collectives_busbw.png").read_bytes().startswith(b"\x89PNG")
    svg = (folder / "collectives_busbw.svg").read_text()
    ET.fromstring(svg)  # well-formed
    for text in ("all_reduce", "broadcast", "gloo ws2", "reference ws2", "busbw (GB/s)"):
        assert text in svg, text
    assert "reference-tp" in (folder / "rpc_rate.svg").read_text()


def test_report_html_embeds_the_benchmarks_of_its_folder(written_folder, tmp_path):
    folder, _ = written_folder
    text = render([], {}, out_dir=str(folder))
    section = text.split('<section id="benchmarks">')[1].split("</section>")[0]
    assert section.count('src="data:image/svg+xml;base64,') == 4  # embedded: the page stays self-contained
    assert 'href="collectives.csv"' in section and 'href="rpc.csv"' in section
    assert "<td>reference</td>" in section and "all_reduce" in section and "nccl: no GPU" in section
    assert "reference-tp" in section and ">9000<" in section
    assert 'id="benchmarks"' not in render([], {}, out_dir=str(tmp_path / "nothing"))


def test_a_benchmark_in_a_conformance_report_folder_refreshes_report_html(tmp_path):
    from reports.html_report import refresh_report
    from reports.json_report import write_json
    from reports.records import CaseRecord

    assert refresh_report(str(tmp_path)) == []  # no conformance run here: nothing to refresh
    write_json(str(tmp_path / "conformance.json"), [CaseRecord("a::t[gloo-ws2]", "c10d", "c", "gloo", 2, "passed")], {})
    (tmp_path / "stress.json").write_text(json.dumps(RPC))  # as the benchmark writes it, before its CSV
    written = benchmarks.write_rpc_outputs(RPC, str(tmp_path)) + refresh_report(str(tmp_path))
    assert str(tmp_path / "report.html") in written
    page = (tmp_path / "report.html").read_text()
    assert 'id="benchmarks"' in page and "a::t[gloo-ws2]" in page
    (tmp_path / "conformance.json").write_text("{broken")
    assert refresh_report(str(tmp_path)) == []


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                       max_leaves=10)
RECORD = st.dictionaries(st.sampled_from(["backend", "world_size", "collective", "size", "time_us", "busbw",
                                          "#wrong", "agent", "mode", "rpcs_per_s", "p50_us", "p99_us", "profiled"]),
                         JSONISH, max_size=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.fixed_dictionaries({"records": st.lists(RECORD | JSONISH, max_size=4)},
                                      optional={"headline": JSONISH, "errors": JSONISH, "unavailable": JSONISH,
                                                "host": JSONISH, "command": JSONISH}))
def test_report_html_survives_any_benchmark_file(tmp_path, document):
    for name in ("collectives.json", "stress.json"):
        (tmp_path / name).write_text(json.dumps(document))
    render([], {}, out_dir=str(tmp_path))


# The collective benchmark writing its CSV and plots, as a user runs it: checked on the run of
# tests/test_stress_collectives.py::test_cli_smoke_gloo (one benchmark process instead of two).


@pytest.mark.filterwarnings("ignore::UserWarning")  # matplotlib on junk: missing glyphs, nothing to log-scale
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(RECORD, min_size=1, max_size=4))
def test_csv_and_plots_survive_any_records(tmp_path, records):
    benchmarks.write_collectives_outputs({"records": records}, str(tmp_path))
    benchmarks.write_rpc_outputs({"records": records}, str(tmp_path))


def test_the_readme_commands_for_a_report_folder(tmp_path):
    """python -m reports.benchmarks DIR and python -m reports.html_report DIR, as the README shows them."""
    from reports.json_report import write_json
    from reports.records import CaseRecord

    def run(*args):
        return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=180)

    empty = run("reports.benchmarks", tmp_path)
    assert empty.returncode == 1 and "no readable collectives.json or stress.json" in empty.stderr
    assert run("reports.html_report", tmp_path).returncode == 2  # no conformance.json: says so
    (tmp_path / "stress.json").write_text(json.dumps(RPC))
    wrote = run("reports.benchmarks", tmp_path)
    assert wrote.returncode == 0 and "rpc.csv" in wrote.stdout and "rpc_rate.svg" in wrote.stdout, wrote.stderr
    write_json(str(tmp_path / "conformance.json"), [CaseRecord("a::t[gloo-ws2]", "c10d", "c", "gloo", 2, "passed")], {})
    page = run("reports.html_report", tmp_path)
    assert page.returncode == 0 and page.stdout.strip().endswith("report.html"), page.stderr
    assert 'id="benchmarks"' in (tmp_path / "report.html").read_text()
    assert run("reports.benchmarks").returncode == 2  # usage
