"""torch's flight-recorder dump format, for the backends that keep a recorder of their own.

A backend that cannot record into torch's recorder (backends/flight_recorders.py says why) keeps the same
information itself and hands the harness dumps shaped like torch's: ``dump(..., pickled=False)`` is what
``torch._C._distributed_c10d._dump_fr_trace_json`` returns (parsed), ``pickled=True`` what ``_dump_fr_trace``
returns (unpickled), the form torch's analyser ``fr_trace`` reads. The one home of that shape: the reference
(backends/reference/flight_recorder.py) and native (native/flight_recorder.py) both format through it.

Entries come in the pickled form (``process_group`` a (name, description) tuple, unset times None), groups as
``Group`` rows; the JSON form turns tuples into lists, unset times into 0 and pg_status numbers into strings, as
torch's JSON dump does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DUMP_VERSION = "2.10"  # the format version torch 2.13's dumps carry; torch's own is used when it answers

UNSET_TIMES = ("time_discovered_started_ns", "time_discovered_completed_ns")

_DTYPE_NAMES: dict[torch.dtype, str] = {}
_version: str | None = None


def dtype_name(dtype: torch.dtype) -> str:
    """c10::toString(ScalarType), as torch's dumps spell a dtype ("Float", "Long", "ComplexHalf")."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = torch.empty(0, dtype=dtype).type()[len("torch."):-len("Tensor")]  # torch.FloatTensor -> Float
        _DTYPE_NAMES[dtype] = name
    return name


def dump_version() -> str:
    """The format version torch's own dumps carry (asked once), so fr_trace reads ours the same way."""
    global _version
    if _version is None:
        try:
            import json

            import torch._C._distributed_c10d as c10d

            dumped = getattr(c10d, "_dump_fr_trace_json")(False, True)  # noqa: B009 - not in torch's stubs
            _version = str(json.loads(dumped).get("version", DUMP_VERSION))
        except Exception:  # noqa: BLE001 - an older torch without the binding: the format we match
            _version = DUMP_VERSION
    return _version


@dataclass(frozen=True)
class Group:
    """One row of pg_config and pg_status: a group's identity and its last enqueued, started and completed
    collective (-1: none)."""

    name: str
    desc: str
    ranks: list[int]
    enqueued: int
    started: int
    completed: int


def dump(entries: list[dict], groups: list[Group], pickled: bool, errors: int = 0) -> dict:
    """A recorder's ``entries`` (pickled form, oldest first) and ``groups`` as torch's JSON dump (``pickled``
    False) or its pickled dump, unpickled (True); ``errors``: recording errors swallowed, shown when any."""
    number = (lambda n: n) if pickled else str
    formatted = entries if pickled else [_json_entry(e) for e in entries]
    result: dict = {
        "version": dump_version(),
        "comm_lib_version": "",
        "pg_config": {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))} for g in groups},
        "pg_status": {g.name: {"last_enqueued_collective": number(g.enqueued),
                               "last_started_collective": number(g.started),
                               "last_completed_collective": number(g.completed)} for g in groups},
        "entries": formatted,
    }
    if errors:
        result["recording_errors"] = errors
    return result


def _json_entry(entry: dict) -> dict:
    formatted = dict(entry, process_group=list(entry["process_group"]))
    for key in UNSET_TIMES:
        if formatted[key] is None:
            formatted[key] = 0
    return formatted
