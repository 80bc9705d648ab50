"""Contract: under a network fault every rank's flight recorder shows the collective it waits in, and never says it
completed: while an all_reduce or a barrier waits across the fault, each rank the fault reaches holds its entry (its
name, the same collective_seq_id on every rank, one past the collectives its group completed before the fault), and
once it raised, its entry's state is not "completed"; the collectives before the fault stay completed.

The recorder read is the one a hang report reads (fixtures/flight_dump.py ``recorded_json``: torch's, merged with a
recorder the backend registered of its own, the reference's), read by each rank of the fault scenario
(suites/faults/scenario.py, the same run every fault clause reads) three times on the group of each collective the
recorder numbers (suites/faults/operations.py ``NUMBERED``: all_reduce and barrier, each on a group of its own):
before the fault, while the collective waits under it (suites/faults/recorder_view.py ``while_waiting``) and once
it ended. "Completed" is read as the hang report reads it (fixtures/hang_report.py): the entry's state "completed",
or pg_status's ``last_completed_collective`` at or past its collective_seq_id (gloo on torch 2.13 never marks an
entry completed, but keeps pg_status). Measured first on gloo (docs/faults.md).
"""

from __future__ import annotations

import re

import pytest

from suites.faults.operations import BY_NAME, NUMBERED, breaks, reached
from suites.faults.table import FAULTS, TABLE

# (fault, collective) pairs: those only a timeout ends (in flight for the timeout's length, long enough to be seen),
# and every one the fault ends with an error
WAITED_OUT = [(f.name, op) for f in FAULTS for op in NUMBERED if f.ends_by == "timeout" and breaks(f, BY_NAME[op])]
FAILING = [(f.name, op) for f in FAULTS for op in NUMBERED if breaks(f, BY_NAME[op])]


def _views(scenario, operation: str) -> list[dict]:
    """Every rank's three reads of its recorder on ``operation``'s group; a skip saying why when the ranks' recorders
    are off."""
    views = [rank["recorder"][operation] for rank in scenario.ranks]
    if any(view["before"]["recorder_size"] <= 0 for view in views):
        pytest.skip("the flight recorder is off in the ranks (TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE "
                    "is 0): nothing to read")
    return views


def _said_completed(read: dict, entry: dict) -> bool:
    """Whether one read of the recorder says ``entry``'s collective completed, as a hang report reads it."""
    last = (read["pg_status"] or {}).get("last_completed_collective", -1)
    return entry["state"] == "completed" or int(last) >= entry["collective_seq_id"]


def _under_fault(views: list[dict], rank: int, read: str) -> dict | None:
    """Rank ``rank``'s entry of the collective issued under the fault in read ``read``, None when it has none."""
    known = {e["record_id"] for e in views[rank]["before"]["entries"]}
    new = [e for e in views[rank][read]["entries"] if e["record_id"] not in known]
    return new[0] if new else None


def _brief(entry: dict | None) -> str:
    return "no entry" if entry is None else f"{entry['profiling_name']} #{entry['collective_seq_id']} " \
                                            f"state {entry['state']!r} retired {entry['retired']}"


@pytest.mark.needs(clause="test_the_recorder_shows_the_collective_each_rank_waits_in")
@pytest.mark.parametrize("fault, operation", WAITED_OUT)
def test_the_recorder_shows_the_collective_each_rank_waits_in(scenario, operation, record_property):
    """While a collective waits under the fault, each rank's recorder holds it, not completed, after the ones the
    group completed: its name and the same collective_seq_id on every rank, one past theirs."""
    views = _views(scenario, operation)
    names = re.compile(BY_NAME[operation].names)
    wrong, seen = {}, {}
    for rank in reached(TABLE[scenario.fault], BY_NAME[operation], len(views)):
        under, before = views[rank]["under"], views[rank]["before"]["entries"]
        entry = _under_fault(views, rank, "under")
        earlier = [e for e in under["entries"] if e not in (entry,)]
        expected = max((e["collective_seq_id"] for e in before), default=0) + 1
        seen[rank] = [e["collective_seq_id"] for e in under["entries"]]
        if not under["in_flight"]:
            wrong[rank] = f"its {operation} ended before the recorder showed it waiting (read as it ended: " \
                          f"{_brief(entry)}, pg_status {under['pg_status']})"
        elif entry is None or not names.match(entry["profiling_name"].split(":", 1)[-1]) \
                or entry["collective_seq_id"] != expected or _said_completed(under, entry):
            wrong[rank] = f"{_brief(entry)}, pg_status {under['pg_status']}; expected {operation} #{expected}, " \
                          f"not completed"
        elif not before or not all(_said_completed(under, e) for e in earlier):
            wrong[rank] = f"the {operation}s completed before the fault: {[_brief(e) for e in earlier]}, " \
                          f"pg_status {under['pg_status']}; expected every one completed"
    record_property("finding", f"rank 0 while waiting: {_brief(_under_fault(views, 0, 'under'))}, "
                               f"pg_status {views[0]['under']['pg_status']}")
    assert not wrong, f"{scenario.fault}, the recorder while the {operation} waits, by rank: {wrong}"
    assert len({tuple(s) for s in seen.values()}) <= 1, f"collective_seq_ids differ between ranks: {seen}"


@pytest.mark.needs(clause="test_the_failed_collective_is_never_recorded_completed")
@pytest.mark.parametrize("fault, operation", FAILING)
def test_the_failed_collective_is_never_recorded_completed(scenario, operation, record_property):
    """Once a collective raised under the fault, each rank's recorder still holds it and its entry's state is not "completed".

    Only the entry's state: torch's own recorders count a collective that
    raised as the group's last completed one in pg_status (ProcessGroupNCCL's
    watchdog sets lastCompletedSeq for every Work whose isCompleted() is true,
    and a Work with an exception is; gloo likewise, measured), while the entry
    keeps the state its events reached (NCCL: "started", its end event never
    came; gloo: "scheduled")."""
    views = _views(scenario, operation)
    raised = [r for r, out in enumerate(scenario.ranks) if not out[operation]["ok"]
              and not out[operation].get("stuck")]
    wrong = {}
    for rank in raised:
        ended = views[rank]["ended"]
        entry = _under_fault(views, rank, "ended")
        if entry is None or entry["state"] == "completed":
            wrong[rank] = f"{_brief(entry)}, pg_status {ended['pg_status']} after " \
                          f"{scenario.ranks[rank][operation]['error'][:120]!r}"
    record_property("finding", f"rank 0 once it raised: {_brief(_under_fault(views, 0, 'ended'))}, "
                               f"pg_status {views[0]['ended']['pg_status']}")
    assert raised or not breaks(TABLE[scenario.fault], BY_NAME[operation]), \
        f"{scenario.fault}: no rank's {operation} raised"
    assert not wrong, f"{scenario.fault}, the recorder after the {operation} raised, by rank: {wrong}"
