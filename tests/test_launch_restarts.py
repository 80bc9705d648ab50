"""Under torchrun --max-restarts a restarted controller continues the run from its journal
(fixtures/launch/journal.py): on two simulated nodes (on simulated hosts under --hosts netns), and the journal itself."""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness_cases.launch_nodes import two_torchrun_nodes
from tests.harness_cases.procs import REPO_ROOT


def test_max_restarts_continues_the_run_after_a_rank_death(tmp_path, launch_hosts):
    """torchrun --max-restarts 1: rank 3 dies once; the restarted workers re-attach and the run continues."""
    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "restart"}, torchrun_args=["--max-restarts", "1"],
                                         hosts=launch_hosts)
    outputs = "\n".join(out for _, out in results)
    assert all(rc != 0 for rc, _ in results), outputs[-3000:]  # a case failed: the run fails
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    with open(os.path.join(REPO_ROOT, "tests", "harness_cases", "launch_cases.py")) as fh:
        functions = re.findall(r"^def (test_\w+)\(", fh.read(), flags=re.M)
    assert sorted(by_name) == sorted(f"{name}[gloo-ws4]" for name in functions)  # every case of the file
    import xml.etree.ElementTree as ET

    names = [case.get("name") for case in ET.parse(tmp_path / "report" / "junit.xml").iter("testcase")]
    assert sorted(names) == sorted(by_name)  # once each in junit.xml too
    death = by_name["test_injected_death_once[gloo-ws4]"]
    assert death["outcome"] == "failed"
    assert "rank 3 on host node1 died (exit status 7)" in death["error"], death["error"]
    assert by_name["test_placement[gloo-ws4]"]["outcome"] == "passed"  # from the first attempt's journal
    assert by_name["test_after_failure[gloo-ws4]"]["outcome"] == "passed"  # run by the restarted workers
    assert "restart 1 of 1: 5 case(s) taken from the earlier attempts' journal" in results[0][1], results[0][1][-3000:]
    logs = sorted(os.listdir(tmp_path / "report" / "ranks"))
    assert "rank3-node1.log" in logs and "rank3-node1-restart1.log" in logs


JOURNAL_CASES = """
import os

def test_a():
    pass

def test_b():
    open("b-ran", "a").write("x")
    open("broken", "w").close()  # the fake cluster breaks here
    assert False, "the world broke"

def test_c():
    pass
"""


class _FakeCluster:
    broken_reason = "rank 3 on host node1 died (exit status 7)"

    @property
    def broken(self) -> bool:
        return os.path.exists("broken")


def test_max_restarts_continues_after_the_controller_itself_is_killed(tmp_path, launch_hosts):
    """The controller is SIGKILLed mid-case (nothing journalled for it): the restarted controller
    records that case as failed because the world broke, and runs the rest; nothing is left."""
    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "controller_killed"},
                                         torchrun_args=["--max-restarts", "1"], hosts=launch_hosts)
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    killed = by_name["test_injected_controller_kill_once[gloo-ws4]"]
    assert killed["outcome"] == "failed"
    assert killed["error"].startswith("the launched world broke while this case ran: the controller was stopped "
                                      "before it learnt why; torchrun restarted the workers (now restart 1 of 1)")
    assert by_name["test_placement[gloo-ws4]"]["outcome"] == "passed"
    assert by_name["test_after_failure[gloo-ws4]"]["outcome"] == "passed"


def test_journal_replays_finished_cases_and_fails_the_one_the_world_broke_under(tmp_path, monkeypatch):
    """Attempt 0 breaks in test_b and stops; killed before test_b's outcome reached the journal,
    attempt 1 replays test_a, records test_b failed with the reason, runs test_c."""
    from fixtures.launch.journal import JOURNAL_NAME, RunJournal

    monkeypatch.chdir(tmp_path)
    # pytest.main in this process reads the caller's PYTEST_ADDOPTS (a CI run with --durations in it made the
    # second attempt's arguments differ from the journal's, so it ran test_b again instead of replaying it)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    (tmp_path / "test_cases.py").write_text(JOURNAL_CASES)
    args = ["test_cases.py", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]

    class Seen:
        def __init__(self):
            self.reports = []

        def pytest_runtest_logreport(self, report):
            self.reports.append(report)

    first = Seen()
    assert pytest.main(args, plugins=[RunJournal(_FakeCluster(), 0, 1, "run", args), first]) == 2  # interrupted
    assert [(r.nodeid.split("::")[1], r.when, r.outcome) for r in first.reports if r.when == "call"] == [
        ("test_a", "call", "passed"), ("test_b", "call", "failed")]
    # the controller was SIGKILLed before test_b's reports were journalled: cut the journal after its start
    journal = tmp_path / JOURNAL_NAME
    lines = journal.read_text().splitlines()
    cut = lines.index('{"kind": "start", "nodeid": "test_cases.py::test_b"}') + 1
    journal.write_text("\n".join(lines[:cut] + ['{"kind": "report", "nod']) + "\n")  # and a torn last line
    os.remove("broken")
    second = Seen()
    assert pytest.main(args, plugins=[RunJournal(_FakeCluster(), 1, 1, "run", args), second]) == 1
    calls = {r.nodeid.split("::")[1]: r for r in second.reports if r.when == "call"}
    assert {name: r.outcome for name, r in calls.items()} == {"test_a": "passed", "test_b": "failed", "test_c": "passed"}
    assert calls["test_b"].longreprtext.startswith("the launched world broke while this case ran: the controller "
                                                    "was stopped before it learnt why; torchrun restarted")
    assert (tmp_path / "b-ran").read_text() == "x"  # test_b did not run again
    # another run id: the journal is not this run's, everything runs
    third = Seen()
    pytest.main(args, plugins=[RunJournal(_FakeCluster(), 1, 2, "other run", args), third])
    assert (tmp_path / "b-ran").read_text() == "xx"
    # broken between cases (a node fell silent) while a restart remains: nothing runs or is recorded
    # (the launch plugin would skip the case with the reason): it is left to the restarted workers
    (tmp_path / "broken").touch()
    fourth = Seen()
    assert pytest.main(args, plugins=[RunJournal(_FakeCluster(), 0, 1, "run", args), fourth]) == 2
    assert fourth.reports == [] and '"kind": "start"' not in journal.read_text()


def _report_json(**over) -> dict:
    from _pytest.reports import TestReport, pytest_report_to_serializable

    report = TestReport("t.py::test_x", ("t.py", 1, "test_x"), {}, "passed", None, "call")
    return {**pytest_report_to_serializable(report), **over}


_REPORT_KEYS = sorted(_report_json())
_JUNK = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                  st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_ENTRY = st.one_of(
    st.fixed_dictionaries({"kind": st.sampled_from(["start", "finish", "report", "broken", "other"]),
                           "nodeid": st.one_of(st.just("t.py::test_x"), _JUNK),
                           "report": st.one_of(st.dictionaries(st.sampled_from(_REPORT_KEYS), _JUNK, max_size=3).map(
                               lambda over: _report_json(**over)), _JUNK),
                           "reason": _JUNK}),
    st.dictionaries(st.sampled_from(["kind", "nodeid", "report", "reason"]), _JUNK, max_size=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_ENTRY.map(json.dumps), st.text(max_size=30)), max_size=8), st.booleans())
def test_any_journal_is_taken_in_or_refused_with_a_note(lines, with_header):
    """The journal is read back from a file a killed process may have torn: never a crash."""
    import tempfile
    from types import SimpleNamespace

    from _pytest.reports import TestReport, pytest_report_from_serializable

    from fixtures.launch.journal import RunJournal

    journal = RunJournal(_FakeCluster(), 1, 1, "run", ["t.py"])
    journal._config = SimpleNamespace(hook=SimpleNamespace(
        pytest_report_from_serializable=lambda config, data: pytest_report_from_serializable(data)))
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as fh:
        fh.write("\n".join(([json.dumps(journal.header)] if with_header else []) + lines))
        fh.flush()
        if journal._read(fh.name):
            assert all(isinstance(r, TestReport) and r.nodeid == nodeid
                       for nodeid, reports in {**journal.finished, **journal.interrupted}.items() for r in reports)
        else:
            assert journal.note.endswith("the run starts over")
