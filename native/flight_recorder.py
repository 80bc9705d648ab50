"""The native backend's flight recorder, as the harness reads it: the extension's records in torch's dump format.

torch 2.13 gives an out-of-tree C++ backend no way to record into its flight
recorder (the gap in native/__init__.py quotes the undefined symbol), so native
keeps its own (native/recorder.hpp: a ring in C++, one entry per collective and
p2p call, marked started and completed as the call's Work runs, sized by
backends/flight_recorders.recorder_size when the process makes its first native
group). This module registers it through the declared hook
(backends/flight_recorders.py) under the name "native", turning the extension's
``flight_records()`` into torch's JSON and pickled dumps with the shared
formatter (backends/flight_format.py). Profiling names are "native:all_reduce",
"native:send 0->1", "native:recv 1<-0" (the calls fr_trace knows, after the
library prefix).
"""

from __future__ import annotations

from types import ModuleType

from backends import flight_format
from backends.flight_recorders import RegisteredRecorder, register

NAME = PREFIX = "native"  # the registered recorder's name, and its profiling names' library
UNNAMED_DESC = "undefined"  # c10d's description of a group nobody described, and the recorder's until it learns one


def _torch_descriptions() -> dict[str, str]:
    """torch's description of each live group, by group name.

    Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps native's Backend in its _ProcessGroupWrapper and describes the
    wrapper (c10d's Backend::setGroupDesc is not virtual, so native's C++ never hears of it): the recorder then
    knows every group as "undefined", and its pg_config would say 'desc': 'undefined' for the default group torch
    calls 'default_pg'. Names reach native either way (create's group_name)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return {}
    world = dist.distributed_c10d._world
    return {name: group.group_desc for group, name in list(world.pg_names.items())}


def dump(extension: ModuleType, pickled: bool) -> dict:
    """The extension's recorder as torch's JSON dump (``pickled`` False) or its pickled dump, unpickled (True)."""
    records = extension.flight_records()
    described = _torch_descriptions()

    def desc(name: str, recorded: str) -> str:
        return described.get(name, recorded) if recorded == UNNAMED_DESC else recorded

    entries = [dict(entry, profiling_name=f"{PREFIX}:{entry['profiling_name']}",
                    process_group=(entry["process_group"][0], desc(*entry["process_group"])))
               for entry in records["entries"]]
    groups = [flight_format.Group(g["name"], desc(g["name"], g["desc"]), list(g["ranks"]),
                                  g["last_enqueued_collective"], g["last_started_collective"],
                                  g["last_completed_collective"])
              for g in records["groups"]]
    return flight_format.dump(entries, groups, pickled, records["errors"])


def register_recorder(extension: ModuleType) -> None:
    """Make the extension's recorder readable by the harness (again: the registration is replaced, not added)."""
    register(RegisteredRecorder(NAME, lambda: dump(extension, pickled=False), lambda: dump(extension, pickled=True)))
