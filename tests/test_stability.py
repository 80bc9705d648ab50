"""--repeat (fixtures/repeat.py) and the Stability section (reports/stability.py), on a planted unstable backend.

tests/unstable_plugin.py deviates deterministically, by a per-rank-process counter: its list all_gather on
every third call, its all_gather_into_tensor (under a declared strict gap) on every second, and a gather
declared intermittent never. Repeated in one persistent world, the counts are exact.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from fixtures.repeat import RepeatVerdicts, case_key
from reports import stability
from tests.harness_cases.procs import run_pytest
from tests.harness_cases.synthetic import record, repeated

FILE = "suites/c10d/test_gather_scatter.py"
PLUGIN = ["--backend-plugin", "tests.unstable_plugin", "--backend", "unstable", "--world-size", "2"]


def stability_section(summary: str) -> str:
    return summary.split("## Stability")[1].split("\n## ")[0]


def test_repeated_cases_vary_and_the_section_names_clause_counts_and_errors(tmp_path):
    # one process (-n 0): the repeats run in order in one world, so the counter's deviations are exact
    run = run_pytest([FILE, *PLUGIN, "--repeat", "6", "-n", "0", "-k", "test_all_gather_list and float32", "-q"],
                     tmp_path, timeout=240)
    assert run.returncode == 1, run.output  # the backend failed the contract in some runs: a failing run
    cases = run.cases()
    ids = [nodeid.split("::")[1] for nodeid in cases]
    assert ids == [f"test_all_gather_list[unstable-ws2-float32-rep{i}of6]" for i in range(1, 7)]
    assert [cases[f"{FILE}::{i}"]["outcome"] for i in ids] == ["passed", "passed", "failed"] * 2
    assert [cases[f"{FILE}::{i}"]["repeat"] for i in ids] == list(range(1, 7))
    assert run.report()["meta"]["repeat"] == 6
    summary = run.read("summary.md")
    section = stability_section(summary)
    assert section.startswith(": 6 runs of each of 1 case (--repeat), 1 varied, in 1 clause")
    assert ("all_gather into a list: entry i on every rank is rank i's tensor — fails 2 of 6 times on unstable at "
            "world size 2 (4 passed, 2 failed; `[unstable-ws2-float32]`)") in section
    assert re.search(r"^  - 2×: AssertionError: all_gather entry \d on rank \d", section, re.M), section
    assert "`[unstable-ws2-float32]` failed in 2 of 6 runs: AssertionError" in summary
    page = run.read("report.html")
    assert 'id="stability"' in page and "fails 2 of 6 times on unstable at world size 2" in page


def test_under_xdist_a_gap_that_shows_sometimes_is_reported_as_varied_and_does_not_fail_the_run(tmp_path):
    selection = "(test_all_gather_into_tensor and int64) or (test_gather_to_every_root and float32)"
    run = run_pytest([FILE, *PLUGIN, "--repeat", "4", "-n", "2", "-k", selection, "-q"], tmp_path, timeout=240)
    assert run.returncode == 0, run.output
    outcomes = {c["nodeid"].split("::")[1]: c["outcome"] for c in run.cases().values()}
    gap_runs = [o for i, o in outcomes.items() if i.startswith("test_all_gather_into_tensor")]
    assert len(gap_runs) == 4 and {"xfailed", "xpassed"} <= set(gap_runs), outcomes  # each worker's 1st call passes
    summary = run.read("summary.md")
    assert "## Failures" not in summary and "**Verdict: PASS** · 1 clause varied over 4 runs" in summary
    section = stability_section(summary)
    assert re.search(r"all_gather into one tensor: chunk i \(in rank order\) is rank i's tensor — its declared gap "
                     r"shows [123] of 4 times on unstable at world size 2 and passes the others", section), section
    assert ("gather(dst=root): entry i of the root's list is rank i's tensor, for every root — on unstable at world "
            "size 2, declared intermittent, showed in none of 4 runs") in section


def test_without_repeat_ids_and_strictness_are_those_of_a_plain_run(tmp_path):
    plain = run_pytest([FILE, *PLUGIN, "--collect-only", "-q", "-k", "float32"], tmp_path / "plain", timeout=120)
    repeated_ = run_pytest([FILE, *PLUGIN, "--collect-only", "-q", "-k", "float32", "--repeat", "3"],
                           tmp_path / "repeated", timeout=120)
    ids = [line for line in plain.stdout.splitlines() if "::" in line]
    assert ids and not any("rep" in line for line in ids)
    again = [line for line in repeated_.stdout.splitlines() if "::" in line]
    assert sorted(again) == sorted(i[:-1] + f"-rep{n}of3]" for i in ids for n in (1, 2, 3))


# ------------------------------------------------------------------ units
def test_case_key_drops_only_the_repeat():
    assert case_key("f.py::t[gloo-ws2-float32-rep3of20]") == "f.py::t[gloo-ws2-float32]"
    assert case_key("f.py::t[gloo-ws2-report]") == "f.py::t[gloo-ws2-report]"
    assert case_key("f.py::t[rep1of2]") == "f.py::t"
    assert case_key("f.py::t") == "f.py::t"
    r = record("f.py::t[gloo-ws2-rep2of5]", "passed", repeat=2, repeats=5)
    assert stability.case_key(r) == case_key(r.nodeid) == "f.py::t[gloo-ws2]"


def test_a_gap_passed_in_every_repeat_fails_the_run_one_passed_sometimes_does_not():
    verdicts = RepeatVerdicts()

    def report(nodeid, passed, **props):
        return SimpleNamespace(when="call", wasxfail="gloo: gap", nodeid=nodeid, passed=passed,
                               user_properties=list(props.items()))

    for i in (1, 2):
        verdicts.pytest_runtest_logreport(report(f"f.py::closed[gloo-ws2-rep{i}of2]", True))
        verdicts.pytest_runtest_logreport(report(f"f.py::varied[gloo-ws2-rep{i}of2]", i == 1))
        verdicts.pytest_runtest_logreport(report(f"f.py::flaky[gloo-ws2-rep{i}of2]", True, intermittent="x"))
    assert verdicts.closed_gaps() == ["f.py::closed[gloo-ws2]"]
    session = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    verdicts.pytest_sessionfinish(session)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED


def test_steady_intermittent_gaps_say_whether_they_always_or_never_showed():
    view = stability.stability(
        repeated("f.py::never", "gloo-ws2", ["passed"] * 3, intermittent="gloo: slow")
        + repeated("f.py::always", "gloo-ws2", ["xfailed"] * 3, intermittent="gloo: slow", reason="gloo: slow"),
        label=lambda r: r.backend)
    assert view is not None and not view.unstable
    assert sorted((s.always, s.runs) for s in view.steady) == [(False, 3), (True, 3)]
    assert "showed in every one of 3 runs" in next(s for s in view.steady if s.always).sentence
