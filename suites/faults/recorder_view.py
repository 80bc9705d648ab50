"""The rank side of the flight-recorder fault clauses: what this rank's flight recorder holds of one group.

A fault scenario (suites/faults/rank_side.py) reads the recorder of the group whose all_reduce meets the fault three
times: before the fault (the collectives that completed), while the all_reduce waits under the fault (``in_flight``)
and once it raised. The recorder read is the one a hang report reads (fixtures/flight_dump.py ``recorded_json``):
torch's, merged with the one a backend registered of its own (the reference's). A rank process serves many
scenarios and torch reuses a destroyed group's name, so a view keeps only the entries recorded after ``since``
(the newest record id naming the group before it was used). Each entry comes back as a small plain dict.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fixtures.flight_dump import recorded_json, recorder_size

SEEN_WAIT_S = 1.0  # how long to wait for a collective just issued to appear in the recorder
KEPT = ("record_id", "profiling_name", "collective_seq_id", "state", "retired")  # what the clauses read of an entry


def identity(group) -> list[str]:
    """How the recorder names ``group``: [name, description]."""
    return [group.group_name, group.group_desc]


def _entries(dump: dict, group, since: int) -> list[dict]:
    return [{key: entry.get(key) for key in KEPT} for entry in dump.get("entries", ())
            if list(entry.get("process_group") or ()) == identity(group) and entry["record_id"] > since]


def newest_record(group) -> int:
    """The newest record id naming ``group`` (an earlier group of that name), -1 when none."""
    return max((e["record_id"] for e in _entries(recorded_json(), group, -1)), default=-1)


def view(group, since: int) -> dict:
    """``group``'s entries recorded after ``since`` (oldest first) and its pg_status row (None when the recorder has
    none for it); ``recorder_size`` 0 says the recorder is off."""
    dump = recorded_json()
    status = dump.get("pg_status", {}).get(group.group_name)
    return {"recorder_size": recorder_size(), "entries": _entries(dump, group, since),
            "pg_status": dict(status) if isinstance(status, dict) else None}


def while_waiting(group, since: int, count: int, done: Callable[[], bool]) -> dict:
    """The view once the group holds ``count`` entries (the collective just issued is recorded), or after
    SEEN_WAIT_S; ``in_flight``: the collective had not ended when the view was read (``done()`` before and after)."""
    end = time.monotonic() + SEEN_WAIT_S
    while True:
        before = done()
        seen = view(group, since)
        if len(seen["entries"]) >= count or time.monotonic() > end or before:
            return {**seen, "in_flight": not before and not done()}
        time.sleep(0.01)
