"""A failure's first line is its cause (the ranks' own exception), in every report format; failures
group by cause; findings fold ranks. Units, then a real run of a spec-less plugin backend whose
list-form all_to_all raises on every rank."""

import xml.etree.ElementTree as ET

import pytest

from fixtures.errors import DeadlineExceeded, RankDied, RankError
from fixtures.protocol import RemoteFailure
from reports import views
from reports.causes import cause_key, cause_of_exception, cause_of_text, with_cause
from reports.folding import fold
from reports.markdown import render
from reports.records import CaseRecord
from tests.harness_cases.procs import run_pytest

ALL_TO_ALL = "suites/c10d/test_all_to_all.py"
PLUGIN = ["--backend-plugin", "tests.harness_cases.plugin_backend", "--backend", "plugin_gloo"]


def rank_error(messages: dict) -> RankError:
    failures = {rank: RemoteFailure(rank, exc_type, text, f"Traceback ...\n{exc_type}: {text}")
                for rank, (exc_type, text) in messages.items()}
    text = "\n".join(f"--- rank {r}: {f.first_line()}\n{f.traceback}" for r, f in failures.items())
    return RankError(f"all_to_all_list raised on ranks {sorted(failures)} of world vendor-ws2:\n{text}", failures)


# -------------------------------------------------------------------- causes
def test_cause_of_a_rank_error_is_the_ranks_exception_with_ranks_folded():
    exc = rank_error({0: ("RuntimeError", "alltoall: invalid tensor size at index 1 (expected (1), got (3))"),
                      1: ("RuntimeError", "alltoall: invalid tensor size at index 1 (expected (2), got (4))")})
    assert cause_of_exception(exc) == (
        "RuntimeError: alltoall: invalid tensor size at index 1 (expected (1–2), got (3–4)) (ranks 0, 1)")


def test_cause_of_ranks_raising_different_exceptions_names_each():
    exc = rank_error({0: ("ValueError", "bad root"), 1: ("torch.distributed.DistBackendError", "peer gone\nmore"),
                      2: ("ValueError", "bad root")})
    assert cause_of_exception(exc) == "ValueError: bad root (ranks 0, 2); torch.distributed.DistBackendError: peer gone (rank 1)"


def test_cause_of_a_dead_rank_is_its_signal_and_the_cpp_what():
    exc = RankDied("rank 0 of world vendor-ws2 died (killed by signal 6 (SIGABRT)) while running attempt.\n"
                   "--- rank 0 output (last 2 lines):\n"
                   "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                   "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4.\n"
                   "Stacks of the other ranks:\n--- rank 1 stack: ...", 0, -6)
    assert cause_of_exception(exc) == ("rank 0 died (killed by signal 6 (SIGABRT)): gloo::EnforceNotMet: "
                                       "[enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4.")


def test_errors_that_are_their_own_cause_have_none():
    assert cause_of_exception(AssertionError("got 3, expected 4")) == ""
    assert cause_of_exception(DeadlineExceeded("f did not finish within its 30 s deadline")) == ""
    assert cause_of_exception(None) == ""


def test_cause_of_a_hang_is_what_the_flight_recorder_says():
    exc = DeadlineExceeded("f did not finish within its 30 s deadline\n...",
                           "rank 1 never entered all_reduce #17 of group default_pg; rank 0 waits in it")
    assert cause_of_exception(exc) == "hang: rank 1 never entered all_reduce #17 of group default_pg; rank 0 waits in it"
    assert cause_key(cause_of_exception(exc)) == \
        "hang: rank N never entered all_reduce #N of group default_pg; rank N waits in it"


def test_cause_recovered_from_recorded_text():
    text = str(rank_error({0: ("RuntimeError", "boom 1"), 1: ("RuntimeError", "boom 2")}))
    assert cause_of_text("fixtures.errors.RankError: " + text) == "RuntimeError: boom 1–2 (ranks 0, 1)"
    assert cause_of_text("AssertionError: got 3\nassert 3 == 4") == "AssertionError: got 3"
    assert cause_of_text("") == ""


def test_the_cause_leads_and_the_wrapper_follows():
    assert with_cause("RuntimeError: x (rank 0)", "RankError: f raised\n--- rank 0") == \
        "RuntimeError: x (rank 0)\nRankError: f raised\n--- rank 0"
    assert with_cause("AssertionError: got 3", "AssertionError: got 3\nassert 3 == 4") == "AssertionError: got 3\nassert 3 == 4"


def test_cause_key_ignores_ranks_numbers_and_addresses_only():
    a = cause_key("RuntimeError: size 3 vs 4 at <PG object at 0x7f5848816470> (ranks 0, 1)")
    assert a == cause_key("RuntimeError: size 5 vs 6 at <PG object at 0x7f584a207eb0> (rank 2)")
    assert a != cause_key("ValueError: size 3 vs 4 at <PG object at 0x7f5848816470> (ranks 0, 1)")


# ------------------------------------------------------------------- folding
def test_fold_groups_ranks_and_shows_differing_numbers_as_ranges():
    entries = fold(["rank 0 raised after 0.50 s: Timed out waiting 500ms",
                    "rank 1 raised after 0.52 s: Timed out waiting 500ms",
                    "rank 1 raised after 0.00 s: ValueError: Global rank 2 is not part of group"])
    assert [e.text for e in entries] == ["ranks 0, 1 raised after 0.50–0.52 s: Timed out waiting 500ms",
                                         "rank 1 raised after 0.00 s: ValueError: Global rank 2 is not part of group"]
    assert entries[0].ranks == [0, 1] and entries[0].count == 2
    assert entries[1].originals == ["rank 1 raised after 0.00 s: ValueError: Global rank 2 is not part of group"]


def test_fold_keeps_texts_that_differ_in_words_apart():
    entries = fold(["sync: raised ValueError", "async: raised ValueError", "sync: raised ValueError"])
    assert [(e.text, e.count) for e in entries] == [("sync: raised ValueError", 2), ("async: raised ValueError", 1)]


# ---------------------------------------------------------------- views + md
def failing(nodeid, cause, clause="c", outcome="failed"):
    return CaseRecord(nodeid, "c10d", clause, "vendor", 2, outcome, cause=cause, error=cause + "\nwrapper")


def test_failures_group_by_cause_most_cases_first():
    records = [failing("a::t[vendor-ws2-1]", "RuntimeError: size 1 vs 3 (ranks 0, 1)", "clause a"),
               failing("a::t[vendor-ws2-2]", "RuntimeError: size 2 vs 4 (ranks 0, 1)", "clause b"),
               failing("a::u[vendor-ws2-1]", "AssertionError: got 3"),
               CaseRecord("a::v[vendor-ws2]", "c10d", "c", "vendor", 2, "xpassed", reason="vendor: no avg")]
    groups = views.failures_by_cause(records)
    assert [(len(g.cases), g.cause) for g in groups] == [
        (2, "RuntimeError: size 1 vs 3 (ranks 0, 1)"), (1, "AssertionError: got 3"),
        (1, "passed although a gap is declared (strict xfail): vendor: no avg")]
    assert groups[0].clauses == ["clause a", "clause b"]
    text = render(records, {})
    assert "## Failures: 4 cases, 3 causes" in text
    assert "| 2 | RuntimeError: size 1 vs 3 (ranks 0, 1) | clause a; clause b |" in text


def test_findings_are_one_line_per_clause_and_distinct_finding():
    records = [CaseRecord(f"a::t[gloo-ws2-{i}]", "c10d", "clause a", "gloo", 2, "passed",
                          findings=[f"rank 0 raised after 0.5{i} s: Timeout", f"rank 1 raised after 0.5{i} s: Timeout"])
               for i in range(5)]
    groups = views.findings_by_clause(records)
    assert [(g.folded.text, len(g.cases)) for g in groups] == [("ranks 0, 1 raised after 0.50–0.54 s: Timeout", 5)]
    assert "- c10d · clause a (5 cases): ranks 0, 1 raised after 0.50–0.54 s: Timeout" in render(records, {})


def test_gaps_declared_by_several_owners_are_one_line():
    records = [CaseRecord(f"r::t[gloo-ws2-{agent}]", "rpc", "c", "gloo", 2, "xfailed", rpc_agent=agent,
                          reason=f"RPC agent {agent}: futures fail by value", error="AssertionError: returned ValueError")
               for agent in ("reference-pg", "reference-tp")]
    [gap] = views.gaps(records)
    assert gap.owners == ["RPC agent reference-pg", "RPC agent reference-tp"] and len(gap.cases) == 2
    assert gap.reason == "futures fail by value" and gap.behaviour == "AssertionError: returned ValueError"


# ---------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "400")  # pytest's short summary line is cut to the terminal width
        return run_pytest([ALL_TO_ALL, *PLUGIN, "--world-size", "2", "-q", "-rf", "-k", "list"],
                          tmp_path_factory.mktemp("causes"), timeout=240)


def test_every_format_leads_with_the_ranks_own_exception(failing_run):
    assert failing_run.returncode == 1, failing_run.output
    failed = {n: c for n, c in failing_run.cases().items() if c["outcome"] == "failed"}
    assert len(failed) >= 3, failing_run.output  # list form, float32 and int64, and the async list form
    for case in failed.values():
        assert case["cause"].startswith("RuntimeError: ProcessGroupGloo::alltoall: invalid tensor size"), case
        assert case["cause"].endswith("(ranks 0, 1)"), case
        first, second = case["error"].splitlines()[:2]
        assert first == case["cause"] and second.startswith("fixtures.errors.RankError: all_to_all_list raised")
    for name, case in failed.items():  # pytest's short test summary
        assert f"FAILED {name} - {case['cause']}" in failing_run.stdout, failing_run.stdout[-3000:]
    root = ET.parse(f"{failing_run.report_dir}/junit.xml").getroot()
    messages = [f.get("message") for f in root.iter("failure")]
    assert len(messages) == len(failed)
    assert all(m.splitlines()[0] == next(iter(failed.values()))["cause"] for m in messages), messages
    summary = failing_run.read("summary.md")
    assert f"## Failures: {len(failed)} cases, 1 cause" in summary
    assert f"| {len(failed)} | RuntimeError: ProcessGroupGloo::alltoall: invalid tensor size" in summary
    assert "fixtures.errors.RankError" not in summary
    assert "RuntimeError: ProcessGroupGloo::alltoall: invalid tensor size" in failing_run.read("report.html")
