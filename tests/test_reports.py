"""reports/: conformance.json, junit.xml and summary.md from a real run, and the record/markdown units."""

import inspect
import json
import re
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from backends.builtin import BUILTIN_SPECS
from reports.markdown import render
from reports.records import CaseRecord, record_from_report
from tests.harness_cases.procs import run_pytest

ALL_REDUCE = "suites/c10d/test_all_reduce.py"
FIELDS = {"nodeid", "area", "clause", "backend", "world_size", "outcome", "duration", "reason", "error"}


# --------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_pytest([ALL_REDUCE, "--world-size", "2", "-q", "-k", "float32"],
                      tmp_path_factory.mktemp("reports"), timeout=240)


def first_doc_line(function_name):
    import suites.c10d.test_all_reduce as module

    return inspect.getdoc(getattr(module, function_name)).splitlines()[0]


def test_conformance_json_has_every_field_of_every_case(run):
    assert run.returncode == 0, run.output
    report = run.report()
    assert report["meta"]["backends"] == "gloo" and report["meta"]["world_sizes"] == "2"
    assert report["meta"]["exit_status"] == 0 and report["meta"]["plugins"] == []
    cases = report["cases"]
    assert cases and [c["nodeid"] for c in cases] == sorted(c["nodeid"] for c in cases)
    outcomes = {}
    for case in cases:
        assert FIELDS <= set(case), case
        path, name = case["nodeid"].split("::")
        assert path == ALL_REDUCE and "float32" in name and "[gloo-ws2-" in name
        assert case["area"] == "c10d"
        assert case["clause"] == first_doc_line(name.split("[")[0])
        assert case["backend"] == "gloo" and case["world_size"] == 2
        assert isinstance(case["duration"], float) and case["duration"] > 0
        outcomes[case["outcome"]] = outcomes.get(case["outcome"], 0) + 1
        if case["outcome"] == "passed":
            assert case["reason"] == "" and case["error"] == ""
    assert set(outcomes) == {"passed", "xfailed"}
    assert report["totals"] == outcomes
    assert f"{outcomes['passed']} passed" in run.stdout and f"{outcomes['xfailed']} xfailed" in run.stdout


def test_xfail_records_the_declared_gap_and_the_backends_actual_error(run):
    cases = run.cases()
    xfailed = [c for c in cases.values() if c["outcome"] == "xfailed"]
    assert [c["nodeid"] for c in xfailed] == [
        f"{ALL_REDUCE}::test_all_reduce_non_contiguous_view[gloo-ws2-float32-sum-non_contiguous]"]
    gap = BUILTIN_SPECS["gloo"].gap_for(collective="all_reduce", layout="non_contiguous")
    case = xfailed[0]
    assert case["reason"] == f"gloo: {gap.reason} [{gap.conditions()}]"
    assert case["error"].startswith("AssertionError: all_reduce sum of a strided view on rank")
    assert "elements wrong" in case["error"]


def test_junit_xml_parses_and_lists_every_case(run):
    root = ET.parse(f"{run.report_dir}/junit.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    testcases = suite.findall("testcase")
    cases = run.cases()
    assert int(suite.get("tests")) == len(testcases) == len(cases)
    assert int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
    names = {tc.get("name") for tc in testcases}
    assert "test_all_reduce[gloo-ws2-float32-sum]" in names
    skipped = [tc.get("name") for tc in testcases if tc.find("skipped") is not None]
    assert skipped == ["test_all_reduce_non_contiguous_view[gloo-ws2-float32-sum-non_contiguous]"]


def test_summary_md_has_the_backend_by_area_table_and_the_gap(run):
    markdown = run.read("summary.md")
    totals = run.report()["totals"]
    assert "| backend | area | passed | failed | error | xfailed | xpassed | skipped |" in markdown
    assert f"| gloo | c10d | {totals['passed']} | 0 | 0 | {totals['xfailed']} | 0 | 0 |" in markdown
    assert "## Known gaps" in markdown and "gloo treats a strided (non-contiguous) view" in markdown
    assert "## Failures" not in markdown and "## Skipped" not in markdown
    assert "backends: `gloo`" in markdown and "world sizes: `2`" in markdown


# ------------------------------------------------------ record_from_report
def fake(when, outcome, *, nodeid="suites/c10d/test_x.py::test_x[gloo-ws2]", duration=0.5, longrepr=None,
         text="", **extra):
    report = SimpleNamespace(
        nodeid=nodeid, when=when, outcome=outcome, duration=duration, longrepr=longrepr, longreprtext=text,
        passed=outcome == "passed", failed=outcome == "failed", skipped=outcome == "skipped",
        user_properties=[("backend", "gloo"), ("world_size", 2), ("area", "c10d"), ("clause", "x does y.")])
    for key, value in extra.items():
        setattr(report, key, value)
    return report


def build(*reports):
    record = None
    for report in reports:
        record = record_from_report(report, record)
    return record


def test_record_of_a_passing_case_sums_its_phases():
    record = build(fake("setup", "passed", duration=0.25), fake("call", "passed", duration=1.0),
                   fake("teardown", "passed", duration=0.25))
    data = record.to_dict()
    assert {key: data[key] for key in FIELDS} == {
        "nodeid": "suites/c10d/test_x.py::test_x[gloo-ws2]", "area": "c10d", "clause": "x does y.",
        "backend": "gloo", "world_size": 2, "outcome": "passed", "duration": 1.5, "reason": "", "error": ""}
    assert "phases" not in data
    assert record.phases == {"setup": "passed", "call": "passed", "teardown": "passed"}


def test_record_collects_findings_once():
    finding = [("finding", "gloo returned rank 0's buffer")]
    call = fake("call", "passed")
    call.user_properties = call.user_properties + finding
    teardown = fake("teardown", "passed")
    teardown.user_properties = teardown.user_properties + finding  # pytest repeats user_properties per phase
    record = build(fake("setup", "passed"), call, teardown)
    assert record.findings == ["gloo returned rank 0's buffer"]
    assert "## Findings" in render([record], {}) and "gloo returned rank 0's buffer" in render([record], {})


def test_record_of_a_skip_at_setup_keeps_the_reason():
    record = build(fake("setup", "skipped", longrepr=("f.py", 3, "Skipped: backend nccl unavailable: no GPU")),
                   fake("teardown", "passed"))
    assert record.outcome == "skipped"
    assert record.reason == "backend nccl unavailable: no GPU"


FAILURE_TEXT = "\n".join([
    "def test_x(world):", ">   assert got == want", "E   AssertionError: got 3", "E   assert 3 == 4",
    "", "suites/c10d/test_x.py:9: AssertionError"])


def test_record_of_an_xfail_keeps_the_gap_and_the_actual_error():
    record = build(fake("setup", "passed"), fake("call", "skipped", text=FAILURE_TEXT, wasxfail="gloo: no avg"),
                   fake("teardown", "passed"))
    assert record.outcome == "xfailed"
    assert record.reason == "gloo: no avg"
    assert record.error == "AssertionError: got 3\nassert 3 == 4"


def test_record_of_a_non_strict_xpass():
    record = build(fake("setup", "passed"), fake("call", "passed", wasxfail="gloo: no avg"))
    assert record.outcome == "xpassed" and record.reason == "gloo: no avg" and record.error == ""


def test_record_of_a_failure_keeps_the_marked_error_lines():
    record = build(fake("setup", "passed"), fake("call", "failed", text=FAILURE_TEXT), fake("teardown", "passed"))
    assert record.outcome == "failed"
    assert record.error == "AssertionError: got 3\nassert 3 == 4"


def test_record_of_an_error_without_marked_lines_keeps_the_tail():
    text = "\n".join(f"line {i}" for i in range(30))
    record = build(fake("setup", "passed"), fake("call", "passed"), fake("teardown", "failed", text=text))
    assert record.outcome == "error"
    assert record.error.splitlines() == [f"line {i}" for i in range(18, 30)]


def test_record_of_a_setup_error():
    record = build(fake("setup", "failed", text="E   WorldStartError: world gloo-ws2 failed to start"),
                   fake("teardown", "passed"))
    assert record.outcome == "error" and record.error == "WorldStartError: world gloo-ws2 failed to start"


# ------------------------------------------------------------------ render
def test_render_tabulates_backend_by_area_and_lists_findings():
    records = [
        CaseRecord("a::t[gloo-ws2-1]", "c10d", "clause a", "gloo", 2, "passed"),
        CaseRecord("a::t[gloo-ws2-2]", "c10d", "clause a", "gloo", 2, "passed"),
        CaseRecord("a::t[gloo-ws2-3]", "c10d", "clause b", "gloo", 2, "failed", error="Boom: a|b\nmore"),
        CaseRecord("a::t[gloo-ws2-4]", "c10d", "clause c", "gloo", 2, "xfailed", reason="gloo: gap", error="E1"),
        CaseRecord("b::t[gloo-ws2-5]", "p2p", "clause d", "gloo", 2, "error", error="teardown broke"),
        CaseRecord("a::t[nccl-ws2-1]", "c10d", "clause a", "nccl", 2, "skipped", reason="backend nccl unavailable"),
        CaseRecord("a::t[nccl-ws2-2]", "c10d", "clause a", "nccl", 2, "skipped", reason="backend nccl unavailable"),
    ]
    text = render(records, {"backends": "gloo,nccl", "world_sizes": "2", "plugins": [], "wall_seconds": 1.0,
                            "exit_status": 1})
    lines = text.splitlines()
    assert "| gloo | c10d | 2 | 1 | 0 | 1 | 0 | 0 |" in lines
    assert "| gloo | p2p | 0 | 0 | 1 | 0 | 0 | 0 |" in lines
    assert "| nccl | c10d | 0 | 0 | 0 | 0 | 0 | 2 |" in lines
    assert "## Failures: 2 cases, 2 causes" in lines
    assert "| 1 | Boom: a\\|b | clause b |" in lines  # pipes escaped, first line only
    assert "- **c10d** · clause b `[gloo-ws2-3]` failed: Boom: a\\|b" in lines  # with its clause
    assert "- **p2p** · clause d `[gloo-ws2-5]` error: teardown broke" in lines
    assert "| gloo | gap | 1 | gloo ws2 | E1 |" in lines  # the owner's prefix is its own column
    assert "- 2: backend nccl unavailable (nccl)" in lines
    assert "pytest exit status: 1" in text
    json.dumps([r.to_dict() for r in records])  # records are JSON-serialisable


# --------------------------------------------------------------- run facts
def test_behaviour_env_keeps_what_changes_behaviour_and_hides_secrets():
    from reports.runfacts import behaviour_env

    env = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "lo", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "UCC_TLS": "tcp",
           "DISTCONFORM_REFERENCE_HOST": "10.0.0.2", "DISTCONFORM_SESSION": "distconform-1-ab", "HOME": "/root",
           "PATH": "/bin", "TORCH_HUB_TOKEN": "s3cret", "MASTER_PORT": "29500"}
    assert behaviour_env(env) == {
        "DISTCONFORM_REFERENCE_HOST": "10.0.0.2", "GLOO_SOCKET_IFNAME": "lo", "MASTER_PORT": "29500",
        "NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_HUB_TOKEN": "(set, value hidden)",
        "UCC_TLS": "tcp"}


# ------------------------------------------------- the summary's size and the Stability section
SUMMARY_BAR = 12 * 1024  # bytes: summary.md fits a terminal page or two however large the run


def test_summary_stays_under_the_bar_however_many_findings_failures_gaps_and_repeats():
    from tests.harness_cases.synthetic import large_run

    for n in (40, 400):
        records = large_run(n)
        text = render(records, {"backends": "gloo,reference", "world_sizes": "2,3", "repeat": 3})
        assert len(text.encode()) < SUMMARY_BAR, (n, len(text.encode()))
        # every section is there, with its counts and the rest left to report.html
        assert text.splitlines()[6].startswith("**Verdict: FAIL** · ")
        # the flaky repeats fail too (2n cases); causes differing only in numbers are one cause (reports/causes.py)
        assert re.search(rf"^## Failures: {2 * n} cases, \d+ causes$", text, re.M)
        assert re.search(r"^… and \d+ more causes: report.html$", text, re.M)
        assert f"… and {2 * n - 8} more failing cases: report.html" in text
        assert re.search(rf"^## Known gaps: \d+, shown in {n} cases", text, re.M)
        assert re.search(r"^… and \d+ more gaps: report.html$", text, re.M)
        assert re.search(rf"^## Findings: \d+ distinct in {n} cases of {n} clauses; every one in report.html$", text, re.M)
        assert f"## Skipped: {n} cases, {n} reasons" in text
        assert f"## Stability: 3 runs of each of {2 * n} cases (--repeat), {n} varied, in {n} clauses" in text
        assert f"… and {n - 6} more varied clauses: report.html" in text
        assert "Declared intermittent, never varied in 3 runs:" in text
        assert "— fails 1 of 3 times on reference at world size 3 (2 passed, 1 failed; `[reference-ws3]`)" in text


def test_stability_section_names_the_clause_backend_world_size_counts_and_errors():
    from tests.harness_cases.synthetic import FLAKY_CAUSE, flaky_all_gather, repeated

    records = flaky_all_gather(20) + repeated("suites/c10d/test_x.py::test_steady", "gloo-ws2", ["passed"] * 20)
    text = render(records, {"backends": "gloo", "repeat": 20})
    section = text.split("## Stability")[1].split("\n## ")[0]
    assert section.startswith(": 20 runs of each of 2 cases (--repeat), 1 varied, in 1 clause")
    assert ("all_gather into a list: entry i on every rank is rank i's tensor — fails 1 of 20 times on gloo at world "
            "size 3 (19 passed, 1 failed; `[gloo-ws3-float32]`)") in section
    assert f"  - 1×: {FLAKY_CAUSE}" in section
    # the failure itself is one line for the case, its repeats folded
    assert "`[gloo-ws3-float32]` failed in 1 of 20 runs: " + FLAKY_CAUSE in text
    assert text.splitlines()[6] == ("**Verdict: FAIL** · 1 case failed (1 cause); 1 clause varied over 20 runs")


def test_a_gap_that_shows_in_some_repeats_is_stability_not_failure():
    from tests.harness_cases.synthetic import repeated

    reason = "gloo: gloo has no PREMUL_SUM"
    records = repeated("suites/c10d/test_all_reduce.py::test_premul", "gloo-ws2", ["xfailed", "xpassed", "xfailed"],
                       reason=reason, cause="RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo")
    text = render(records, {"backends": "gloo", "repeat": 3})
    assert "## Failures" not in text and text.splitlines()[6].startswith("**Verdict: PASS** · 1 clause varied")
    assert "its declared gap shows 2 of 3 times on gloo at world size 2 and passes the others" in text
    # a gap passed in every repeat closed: a failure, as a strict xfail's pass always is
    closed = repeated("suites/c10d/test_all_reduce.py::test_premul", "gloo-ws2", ["xpassed"] * 3, reason=reason)
    text = render(closed, {"backends": "gloo", "repeat": 3})
    assert "## Failures: 3 cases, 1 cause" in text and "passed although a gap is declared" in text


def test_a_plain_run_has_no_stability_section_and_its_ids_stay():
    from reports.stability import case_key
    from tests.harness_cases.synthetic import record

    plain = [record("suites/c10d/test_a.py::test_a[gloo-ws2-float32]", "passed")]
    text = render(plain, {"backends": "gloo"})
    assert "Stability" not in text and text.splitlines()[6] == "**Verdict: PASS** · every case that ran held the contract"
    assert case_key(plain[0]) == plain[0].nodeid
