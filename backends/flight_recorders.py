"""Flight recorders a backend keeps besides torch's, registered where the harness reads them.

torch 2.13 records flight-recorder entries from C++ only (``FlightRecorder<c10::Event>::record``,
called by ProcessGroupGloo and ProcessGroupNCCL themselves), and torch._C._distributed_c10d binds no
way to add an entry, so a backend written in Python (the reference) cannot record there. Such a backend
keeps a recorder of its own holding the same information and registers it here: a name and two
callables that dump it as torch's ``_dump_fr_trace_json`` and ``_dump_fr_trace`` do (the JSON's dict,
and the pickled dump's dict unpickled: the form torch's analyser ``fr_trace`` reads). The harness
(fixtures/flight_dump.py) merges every registered recorder with torch's in a hang report, and the
flight-recorder clauses read them as "the backend's own recorder" (``recorder="backend"``).

A backend registers when it makes its first group, so a process that never made one of its groups
holds no registration of it (the clauses then know the backend keeps no recorder of its own).

Also the one home of the recorder's size variables, which a backend's own recorder honours as torch's
does (0: off).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

FR_SIZE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DEFAULT_FR_SIZE = 2000  # torch's own default: the recorder is on unless a variable sets 0


def recorder_size() -> int:
    """The recorder's capacity as torch reads it: the first of FR_SIZE_VARS that is set, else torch's default."""
    for var in FR_SIZE_VARS:
        if os.environ.get(var):
            return int(os.environ[var])
    return DEFAULT_FR_SIZE


@dataclass(frozen=True)
class RegisteredRecorder:
    """A backend's own flight recorder: ``dump_json()`` as torch's JSON dump, ``dump_pickle()`` as its pickled
    dump unpickled (process_group a tuple, pg_status numbers as ints, unset times None)."""

    name: str
    dump_json: Callable[[], dict]
    dump_pickle: Callable[[], dict]


_REGISTERED: dict[str, RegisteredRecorder] = {}


def register(recorder: RegisteredRecorder) -> None:
    """Make ``recorder`` readable by the harness; registering a name again replaces the earlier one."""
    _REGISTERED[recorder.name] = recorder


def registered() -> tuple[RegisteredRecorder, ...]:
    """Every recorder registered in this process, in registration order."""
    return tuple(_REGISTERED.values())
