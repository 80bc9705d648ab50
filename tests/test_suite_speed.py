"""suites/stress/suite_speed.py and the timing section of summary.md: where a run's time went."""

from __future__ import annotations

import json

from reports import markdown, views
from reports.records import CaseRecord
from suites.stress import suite_speed


def case(nodeid: str, area: str, duration: float, backend: str = "gloo", agent: str = "") -> dict:
    return {"nodeid": nodeid, "area": area, "clause": f"clause of {nodeid.split('[')[0]}", "backend": backend,
            "world_size": 2, "outcome": "passed", "duration": duration, "reason": "", "error": "", "cause": "",
            "findings": [], "rpc_agent": agent, "debug_level": "OFF"}


CASES = [case("suites/c10d/test_a.py::test_fast[gloo-ws2-x]", "c10d", 0.5),
         case("suites/c10d/test_a.py::test_fast[gloo-ws2-y]", "c10d", 0.5),
         case("suites/rpc/test_t.py::test_waits[gloo-ws2-tensorpipe]", "rpc", 4.0, agent="tensorpipe"),
         case("suites/rpc/test_t.py::test_waits[gloo-ws2-reference-tp]", "rpc", 2.0, agent="reference-tp")]


def write(tmp_path, name: str, cases: list[dict], wall: float):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "conformance.json").write_text(json.dumps({"meta": {"wall_seconds": wall, "exit_status": 0},
                                                         "totals": {}, "cases": cases}))
    return folder


def test_table_puts_runs_side_by_side_with_wall_time(tmp_path, capsys):
    before = write(tmp_path, "before", CASES, wall=10.0)
    after = write(tmp_path, "after", CASES[:2] + [case(CASES[2]["nodeid"], "rpc", 1.0, agent="tensorpipe")], wall=2.0)
    assert suite_speed.main(["--report", f"before={before}", "--report", f"after={after}"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "area | before: cases | before: seconds | before: cases/s | after: cases" in out
    assert "rpc | 2 | 6.0 | 0.3 | 1 | 1.0 | 1.0" in lines  # the slowest area first
    assert "wall time | 4 | 10.0 | 0.4 | 3 | 2.0 | 1.5" in lines
    assert "suites/rpc/test_t.py::test_waits" in out.split("before: the 10 slowest clauses")[1]


def test_bad_label_is_a_usage_error(capsys):
    try:
        suite_speed.main(["--report", "no-label"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "expected LABEL=VALUE" in capsys.readouterr().err


def test_summary_shows_the_slowest_clauses_and_report_html_the_time_per_backend_and_area():
    """summary.md keeps the few slowest clauses (issue 33: a summary that fits a terminal); the table per
    backend and area is report.html's (views.durations_by_area)."""
    records = [CaseRecord.from_dict(c) for c in CASES]
    clauses = views.slowest_clauses(records)
    assert [c.function for c in clauses] == ["suites/rpc/test_t.py::test_waits", "suites/c10d/test_a.py::test_fast"]
    assert clauses[0].total == 6.0 and clauses[0].cases == 2
    text = markdown.render(records, {"wall_seconds": 3.5})
    assert "## Where the time went" in text and "add up to 7.0 s in 3.5 s of wall time" in text
    assert "- 6.0 s, 2 cases: rpc · clause of suites/rpc/test_t.py::test_waits" in text
    by_area = {(t.target, t.area): (t.cases, t.total) for t in views.durations_by_area(records)}
    assert by_area[("gloo · rpc tensorpipe", "rpc")] == (1, 4.0)
