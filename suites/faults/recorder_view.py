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
from dataclasses import dataclass
from typing import Any

from fixtures.flight_dump import recorded_json, recorder_size

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


def view(group, since: int, dump: dict | None = None) -> dict:
    """``group``'s entries recorded after ``since`` (oldest first) and its pg_status row (None when the recorder has
    none for it); ``recorder_size`` 0 says the recorder is off. ``dump``: a recorder read already made."""
    dump = recorded_json() if dump is None else dump
    status = dump.get("pg_status", {}).get(group.group_name)
    return {"recorder_size": recorder_size(), "entries": _entries(dump, group, since),
            "pg_status": dict(status) if isinstance(status, dict) else None}


@dataclass(frozen=True)
class Waiting:
    """A call issued on a thread of its own, on a group of its own: what ``while_waiting`` reads for it."""

    group: Any
    since: int  # the newest record id naming the group before the scenario (``newest_record``)
    count: int  # the entries the group holds once the call is recorded
    done: Callable[[], bool]  # whether the call has ended


def while_waiting(calls: dict[str, Waiting], bound_s: float) -> dict[str, dict]:
    """Each call's view, read once its group holds the call's entry or the call has ended, the calls polled together
    from one recorder read at a time; ``in_flight``: the call had not ended when its view was read (``done()``
    before and after). No bound but ``bound_s``, the one a call under the fault ends within: how long a loaded
    machine takes to issue the call (over 1 s, once, before a bound of that length) is no finding about the
    recorder; a call recorded only when it ended shows all the same, ended or counted completed when it appears."""
    views: dict[str, dict] = {}
    end = time.monotonic() + bound_s
    while True:
        ended = {name: call.done() for name, call in calls.items() if name not in views}
        dump = recorded_json()
        for name in ended:
            call = calls[name]
            seen = view(call.group, call.since, dump)
            if len(seen["entries"]) >= call.count or ended[name] or time.monotonic() > end:
                views[name] = {**seen, "in_flight": not ended[name] and not call.done()}
        if len(views) == len(calls):
            return views
        time.sleep(0.01)
