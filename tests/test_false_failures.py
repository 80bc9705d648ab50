"""suites/stress/false_failures.py: runs aggregated case by case (the runs themselves are the measurement)."""

from reports.records import CaseRecord
from suites.stress import false_failures
from suites.stress.suite_speed import Measured


def run(exit_status: int, **outcomes: str) -> Measured:
    records = [CaseRecord(nodeid=node, outcome=outcome, error="AssertionError: x differs" if outcome == "failed" else "")
               for node, outcome in outcomes.items()]
    return Measured("r", records, 10.0, exit_status)


def test_a_failure_in_one_run_is_named_with_its_runs_and_cause_and_fails_the_measurement():
    runs = [run(0, a="passed", b="xfailed"), run(1, a="failed", b="xfailed"), run(0, a="passed", b="xpassed")]
    summary = false_failures.aggregate(runs)
    assert summary["failed_runs"] == 1
    assert summary["failures"] == [{"nodeid": "a", "failed_in": [2], "causes": ["AssertionError: x differs"]}]
    assert summary["varied"] == [{"nodeid": "b", "outcomes": {"xfailed": 2, "xpassed": 1}}]
    text = false_failures.render(runs, summary)
    assert "a: runs [2]: AssertionError: x differs" in text
    assert text.splitlines()[-1] == "false failures: 1 of 3 runs failed, 1 cases failed, 1 more varied"


def test_identical_green_runs_report_nothing_to_fix():
    runs = [run(0, a="passed", b="skipped")] * 3
    summary = false_failures.aggregate(runs)
    assert summary["failed_runs"] == 0 and summary["failures"] == [] and summary["varied"] == []
