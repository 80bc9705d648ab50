"""A hang names the collective each rank is in: fixtures/hang_report.py on made-up dumps, then the harness
end to end (fixtures/flight_dump.py in the ranks, fixtures/world.py collecting, the world fixture keeping the
dumps beside the report)."""

import dataclasses
import json
import os
import pickle

import pytest

from backends.registry import BackendRegistry
from fixtures.errors import DeadlineExceeded, RankError
from fixtures.flight_dump import recorder_size_problem
from fixtures.fr_trace_input import complete_entries, complete_pg_config, relabel_unknown_libraries
from fixtures.hang_report import analyse
from fixtures.world import World
from tests.harness_cases import rank_fns
from tests.harness_cases.fr_analyser import fr_trace_output
from tests.harness_cases.procs import finish_pytest, run_pytest, start_pytest

# func_only: a fixture's time is not counted, so a cold native build (backend_built: 2.5 min under CI's load, where
# the whole-run bound of pyproject.toml applies) never eats a hang test's own bound
pytestmark = pytest.mark.timeout(240, func_only=True)

CASE_FILE = "tests/harness_cases/case_skipped_collective.py"


def entry(record_id, seq, name="all_reduce", group=("0", "default_pg"), state="scheduled"):
    return {"record_id": record_id, "collective_seq_id": seq, "profiling_name": f"gloo:{name}",
            "process_group": list(group), "state": state, "is_p2p": False}


def dump(entries, status=None, size=2000):
    return {"entries": entries, "pg_status": status or {}, "pg_config": {},
            "distconform": {"rank": 0, "recorder_size": size}}


def status(enqueued, completed, name="0"):
    return {name: {"last_enqueued_collective": str(enqueued), "last_completed_collective": str(completed),
                   "last_started_collective": "-1"}}


# ------------------------------------------------------- the analysis alone
def test_names_the_rank_that_never_entered_and_the_ranks_waiting():
    waiting = dump([entry(0, 16), entry(1, 17)], status(17, 16))
    away = dump([entry(0, 16)], status(16, 16))
    report = analyse({0: waiting, 1: away, 2: waiting}, 3)
    assert report.summary == "rank 1 never entered all_reduce #17 of group default_pg; ranks 0, 2 wait in it"
    assert report.lines == [
        "rank 0: waiting in all_reduce #17 of group default_pg (completed #16)",
        "rank 1: last entered all_reduce #16 of group default_pg (completed #16)",
        "rank 2: waiting in all_reduce #17 of group default_pg (completed #16)",
    ]


def test_completion_read_from_entry_states_when_pg_status_has_none():
    done = dump([entry(0, 1, state="completed"), entry(1, 2, name="broadcast")])
    report = analyse({0: done, 1: dump([entry(0, 1, state="completed")])}, 2)
    assert report.summary == "rank 1 never entered broadcast #2 of group default_pg; rank 0 waits in it"
    assert "rank 1: last entered all_reduce #1 of group default_pg (completed #1)" in report.lines


def test_every_rank_inside_the_same_collective():
    inside = dump([entry(0, 5, name="barrier")], status(5, 4))
    report = analyse({0: inside, 1: inside}, 2)
    assert report.summary == "every member entered barrier #5 of group default_pg; ranks 0, 1 still wait in it"


def test_an_earlier_group_of_the_same_name_is_not_the_live_one():
    """Group "1" of an earlier case reached #3; the live group "1" (pg_status: nothing enqueued) has no entries."""
    group = ("1", "undefined")
    earlier = [entry(0, 1, group=group), entry(1, 3, group=group)]
    report = analyse({0: dump(earlier + [entry(2, 1, group=group)], status(1, 0, "1")),
                      1: dump(earlier, status(0, 0, "1"))}, 2)
    assert report.summary == ("rank 0 waits in all_reduce #1 of group 1; rank 1 recorded nothing of it "
                              "(its members are not recorded)")
    assert "rank 1: recorded nothing of group 1 (a member that never entered it, or not a member: the recorder " \
           "does not list group 1's ranks)" in report.lines


def test_no_recorder_and_missing_dumps_say_so_in_one_line_each():
    empty = dump([])
    report = analyse({0: empty, 1: empty}, 2, "a Python backend cannot record")
    assert report.summary == ""
    assert report.lines == ["flight recorder: no rank recorded a collective: a Python backend cannot record"]
    report = analyse({0: dump([], size=0), 1: None}, 2)
    assert report.lines[:2] == ["rank 0: flight recorder off (TORCH_FR_BUFFER_SIZE=0)",
                                "rank 1: no flight-recorder dump came (the process is gone, frozen, cut off or did not "
                                "answer)"]


def test_a_member_that_sent_no_dump_is_named_by_its_host_not_counted_as_inside():
    """A partitioned or frozen rank answers no dump request: the summary names it (and its host), never says that
    every member entered the collective the others wait in."""
    inside = dump([entry(0, 2)], status(2, 1))
    report = analyse({0: inside, 1: None, 2: inside}, 3, hosts={0: "127.77.0.1", 1: "127.77.0.2", 2: "127.77.0.3"})
    assert report.summary == ("ranks 0, 2 wait in all_reduce #2 of group default_pg; rank 1 (host 127.77.0.2) "
                              "sent no flight-recorder dump (cut off, frozen or gone)")
    assert "rank 1 (host 127.77.0.2): no flight-recorder dump came (the process is gone, frozen, cut off or did " \
           "not answer)" in report.lines
    assert analyse({0: inside, 1: None}, 2).summary == ("rank 0 waits in all_reduce #2 of group default_pg; rank 1 "
                                                        "sent no flight-recorder dump (cut off, frozen or gone)")


def test_nothing_pending_is_said_too():
    done = dump([entry(0, 4)], status(4, 4))
    report = analyse({0: done, 1: done}, 2)
    assert report.summary == ""
    assert report.lines == ["flight recorder: no rank is inside a recorded collective (on every group, each rank's "
                            "last recorded one has completed or failed): the hang is outside what the recorder saw"]


def test_pg_config_gets_the_groups_the_entries_name():
    """gloo's recorder lists the default group as '' and no new_group; fr_trace needs the entries' names."""
    mine = dump([entry(0, 1), entry(1, 1, group=("5", "undefined"))])
    mine["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
    other = dump([entry(0, 1, group=("5", "undefined"))])
    added = complete_pg_config(mine, {0: mine, 1: None, 2: other}, 3)
    assert added == ["0", "5"]
    assert mine["pg_config"]["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}
    assert mine["pg_config"]["5"] == {"name": "5", "desc": "undefined", "ranks": "[0, 2]"}
    assert mine["pg_config"][""] == {"name": "", "desc": "", "ranks": "[0, 1, 2]"}  # the recorder's own row stays
    assert complete_pg_config(mine, {0: mine}, 3) == []


def test_a_rank_that_recorded_nothing_gets_the_entries_fr_trace_reads():
    """torch leaves 'entries' out of a recorder that holds none; fr_trace ends in KeyError: 'entries' on it."""
    nothing = {"version": "2.10", "pg_config": {}, "pg_status": {}}
    assert complete_entries(nothing) and nothing["entries"] == []
    assert not complete_entries(nothing) and not complete_entries(dump([entry(0, 1)]))


def test_fr_trace_copies_name_a_library_fr_trace_lists():
    """fr_trace refuses 'reference:all_reduce' ("name formatting error? reference not in {...}")."""
    mine = dump([entry(0, 1), entry(1, 2, name="broadcast")])
    mine["entries"][1]["profiling_name"] = "reference:broadcast"
    assert relabel_unknown_libraries(mine) == ["reference"]
    assert [e["profiling_name"] for e in mine["entries"]] == ["gloo:all_reduce", "gloo:broadcast"]
    assert relabel_unknown_libraries(mine) == []


@pytest.mark.parametrize("value, fine", [("", False), ("lots", False), (" 5", False), ("0", True), ("2000", True),
                                         (None, True)])
def test_recorder_size_must_be_a_number_or_unset(value, fine):
    env = {} if value is None else {"TORCH_FR_BUFFER_SIZE": value}
    problem = recorder_size_problem(env)
    assert (problem == "") == fine, problem
    if not fine:
        assert problem.startswith(f"TORCH_FR_BUFFER_SIZE={value!r}: expected a whole number"), problem


def test_empty_recorder_size_is_a_usage_error_before_any_world(tmp_path, monkeypatch):
    """torch aborts a rank's init_process_group on TORCH_FR_BUFFER_SIZE= and its peers wait: never start one."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "")
    run = finish_pytest(start_pytest([CASE_FILE, "--backend", "gloo", "--world-size", "2", "-q"], tmp_path),
                        timeout=60)
    assert run.returncode == 4, run.output  # pytest's usage error
    assert "TORCH_FR_BUFFER_SIZE='': expected a whole number" in run.output, run.output


# ------------------------------------------------------- a live world
@pytest.fixture(scope="module")
def registry():
    return BackendRegistry()


def hang(registry, backend: str, world_size: int, evidence, rank_env: dict | None = None) -> DeadlineExceeded:
    """Rank 1 of a fresh world skips an all_reduce; the deadline's failure, with dumps kept in ``evidence``.
    ``rank_env``: variables the ranks get on top of the backend's own."""
    spec = registry.get(backend)
    if rank_env:
        spec = dataclasses.replace(spec, rank_env={**spec.rank_env, **rank_env})
    world = World(spec, world_size, ("cpu",) * world_size).start()
    world.evidence_dir = str(evidence)
    try:
        with pytest.raises(DeadlineExceeded) as info:
            world.run(rank_fns.all_reduce_skipped_by, 1, deadline=3)
    finally:
        world.kill()
    return info.value


@pytest.mark.parametrize("backend", ["gloo", "reference", "native"])
def test_hang_names_the_missing_rank_and_keeps_the_dumps(registry, tmp_path, backend, backend_built):
    """gloo records into torch's recorder; the reference and native into their own, registered
    (backends/flight_recorders.py)."""
    failure = hang(registry, backend, 3, tmp_path / "evidence")
    text = str(failure)
    summary = failure.hang_summary
    assert summary.startswith("rank 1 never entered all_reduce #") and summary.endswith(
        " of group default_pg; ranks 0, 2 wait in it"), text
    seq = int(summary.split("#", 1)[1].split()[0])
    assert f"summary: {summary}" in text
    assert f"rank 0: waiting in all_reduce #{seq} of group default_pg (completed #{seq - 1})" in text
    assert f"rank 1: last entered all_reduce #{seq - 1} of group default_pg (completed #{seq - 1})" in text
    assert "Python stacks of every rank at expiry" in text  # the stacks are still there
    for rank in range(3):
        with open(tmp_path / "evidence" / f"rank{rank}.json") as fh:
            kept = json.load(fh)
        assert kept["distconform"]["rank"] == rank and kept["entries"], kept
        with open(tmp_path / "evidence" / f"rank_{rank}", "rb") as fh:
            assert pickle.load(fh)["entries"]  # torch's pickled dump, for fr_trace --prefix rank_
    # torch's analyser reads the kept dumps (as gloo wrote them it fails with "KeyError: ('0', 0)"; the reference's
    # and native's names are relabelled for it: fixtures/fr_trace_input.py)
    output = fr_trace_output(tmp_path / "evidence")
    assert "missing ranks: {1}" in output and f"sequence number: {seq}" in output, output


@pytest.fixture
def backend_built(backend: str) -> None:
    """The native extension, built here (once per checkout, minutes) rather than inside a rank's deadline or the
    test's own bound; other backends need nothing built."""
    if backend != "native":
        return
    from native import build

    try:
        build.load()
    except build.BuildFailed as exc:
        pytest.fail(f"the native extension does not build: {exc}")


def test_ranks_still_running_after_a_failure_get_the_report_too(registry):
    world = World(registry.get("gloo"), 2, ("cpu",) * 2).start()
    try:
        with pytest.raises(RankError) as info:
            world.run(rank_fns.rank1_raises_rank0_all_reduces)
    finally:
        world.kill()
    text = str(info.value)
    assert "marker-4712" in text and "Collectives then (flight recorders):" in text, text
    assert "summary: rank 1 never entered all_reduce #" in text and "rank 0 waits in it" in text, text


def test_hang_with_the_recorder_off_says_so_per_rank_and_keeps_nothing(registry, tmp_path):
    """TORCH_FR_BUFFER_SIZE=0 turns the reference's own recorder off too: one line per rank, no dumps kept."""
    failure = hang(registry, "reference", 2, tmp_path / "evidence", {"TORCH_FR_BUFFER_SIZE": "0"})
    off = [line for line in str(failure).splitlines() if "flight recorder off" in line]
    assert len(off) == 2, str(failure)
    assert failure.hang_summary == ""
    assert not os.path.exists(tmp_path / "evidence"), "empty dumps kept"


def test_pytest_run_reports_the_hang_cause_and_keeps_dumps_beside_the_report(tmp_path):
    run = run_pytest([CASE_FILE, "--backend", "gloo", "--world-size", "2", "-q"], tmp_path)
    assert run.returncode == 1, run.output
    node = f"{CASE_FILE}::test_last_rank_skips_an_all_reduce[gloo-ws2]"
    case = run.cases()[node]
    first = case["error"].splitlines()[0]
    assert first.startswith("hang: rank 1 never entered all_reduce #") and "rank 0 waits in it" in first, case["error"]
    folder = tmp_path / "flight-recorder" / "tests_harness_cases_case_skipped_collective.py_test_last_rank_skips_an_all_reduce_gloo-ws2"
    assert sorted(os.listdir(folder)) == ["rank0.json", "rank1.json", "rank_0", "rank_1"], os.listdir(tmp_path)


def test_dumps_of_two_recorders_merge_per_group():
    """A CUDA build holds torch's generic recorder and ProcessGroupNCCL's own (torch 2.11 files NCCL's entries in
    the latter): the entries of both, once each; per group the pg_config/pg_status row of the recorder holding its
    entries (the other lists the group with no ranks and status -1, as seen on an H200)."""
    from fixtures.flight_dump import _merge

    generic = {"pg_config": {"0": {"ranks": "[]"}, "5": {"ranks": "[0, 1]"}},
               "pg_status": {"0": {"last_completed_collective": "-1"}},
               "entries": [{"process_group": ["5", "undefined"], "record_id": 0}]}
    nccl = {"pg_config": {"0": {"ranks": "[0, 1]"}}, "pg_status": {"0": {"last_completed_collective": "3"}},
            "entries": [{"process_group": ["0", "default_pg"], "record_id": r} for r in range(3)]}
    merged = _merge([generic, nccl])
    assert len(merged["entries"]) == 4
    assert merged["pg_config"] == {"0": {"ranks": "[0, 1]"}, "5": {"ranks": "[0, 1]"}}
    assert merged["pg_status"]["0"]["last_completed_collective"] == "3"
    assert len(_merge([nccl, nccl])["entries"]) == 3  # a release that unifies the recorders: no duplicates
