"""The reference as a c10d ``Backend`` (torch 2.14 on): what torch's own ProcessGroup holds per device.

torch routes a device-qualified string (``"cpu:reference,cuda:gloo"``) by asking each part's creator for a
``Backend`` and registering it for that part's device on a ProcessGroup of its own; a creator that returns a
``ProcessGroup`` instead (what Python could write before 2.14) replaces that group, every device and part of the
string with it (``_new_process_group_helper``: "the old behavior for PythonProcessGroups"). A Python subclass of
``torch._C._distributed_c10d.Backend`` constructs from torch 2.14 on (2.13: "No constructor defined!"), so from
2.14 on the reference's creator returns ``ReferenceBackend`` and the string routes per device as torch intends.

Only a string that names other backends beside the reference takes this form: torch hands a Backend's Works back
to Python wrapped in a ``PyWorkHolder`` that forwards ``wait`` and ``get_future`` only (torch 2.14.1
``py/PyProcessGroup.hpp``), so through it ``is_completed()`` stays False after ``wait()``, and ``result()``,
``source_rank()``, ``exception()`` and ``_get_duration()`` fail (measured: 24 of 687 c10d and p2p cases at world
size 2). A group of the reference alone loses nothing by being the ProcessGroup itself, and keeps those. torch tells
a creator neither the string nor the device it creates for, so ``names_other_backends`` reads the string from the
frame of torch's one caller of creators (``_new_process_group_helper``'s ``backend_config``).

``ReferenceBackend`` keeps no logic of its own: a ``ReferenceProcessGroup`` (process_group.py, the spec) answers
every operation, by the names torch's trampoline (``PyBackend``) looks up in Python. What differs is what torch's
ProcessGroup now does around it, as for any C++ backend: pre/post hooks, the group's name, size and rank.
Its rank and size are fixed when it is made (``Backend::getSize`` is not virtual and Python cannot set it), so
this form refuses a reconfigure that would renumber it. ``shrink_group`` needs this form on every torch that
has it (it registers what ``shrink()`` returns as a C++ Backend).
"""

from __future__ import annotations

import sys

# torch 2.14 lets Python subclass c10d's Backend (a constructor that 2.13's binding lacks)
try:
    from torch._C._distributed_c10d import Backend as _CBackend

    _CBackend(0, 1)
    AVAILABLE = True
except (ImportError, TypeError, RuntimeError):
    _CBackend = object  # type: ignore[assignment,misc]
    AVAILABLE = False

# the operations torch's ProcessGroup hands its backend, by the names PyBackend looks up in Python (and the
# deprecated aliases a Python caller of the backend may still use) -> the ReferenceProcessGroup method that does it,
# with the same arguments in the same order
OPERATIONS = {name: name for name in (
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "allgather_coalesced",
    "all_gather_single", "all_gather_single_coalesced", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_single_coalesced", "alltoall", "all_to_all_single", "barrier", "send",
    "recv", "recv_anysource", "_get_sequence_number_for_group", "_set_sequence_number_for_group",
    "_wait_for_pending_works", "_register_on_completion_hook", "get_reconfigure_handle", "get_error", "abort",
    "shutdown", "set_timeout")} | {
    "allreduce_sparse": "allreduce", "_allgather_base": "all_gather_single",
    "allgather_into_tensor_coalesced": "all_gather_single_coalesced", "_reduce_scatter_base": "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single_coalesced", "alltoall_base": "all_to_all_single",
    # PyBackend's Python names for startCoalescing/endCoalescing and the abort hooks (its C++ names)
    "start_coalescing": "_start_coalescing", "end_coalescing": "_end_coalescing",
    "registerAbortHook": "register_abort_hook", "unregisterAbortHook": "unregister_abort_hook"}


def names_other_backends(caller_depth: int = 2) -> bool:
    """Whether the group torch is making names other backends beside this one (``"cpu:reference,cuda:gloo"``),
    read from the ``backend_config`` of torch's ``_new_process_group_helper``, the creator's caller (the frame
    ``caller_depth`` up from here). Without one (another caller, another torch): False."""
    config = sys._getframe(caller_depth).f_locals.get("backend_config")
    routes = getattr(config, "get_device_backend_map", None)
    return callable(routes) and len(set(map(str, routes().values()))) > 1


class ReferenceBackend(_CBackend):
    """The reference's c10d Backend: every operation answered by ``group``, a ReferenceProcessGroup."""

    def __init__(self, group) -> None:
        super().__init__(group.rank(), group.size())
        self.group = group

    def __repr__(self) -> str:
        return f"<ReferenceBackend of {self.group!r}>"

    def getBackendName(self) -> str:  # torch's name() asks it (INTERNAL ASSERT without it)
        return "reference"

    def _get_backend_name(self) -> str:
        return "reference"

    def _set_group_uid(self, name: str) -> None:  # c10d names its ProcessGroup: the backend is told so
        self.group._set_group_name(name)

    def _enable_collectives_timing(self) -> None:
        """Nothing to switch on: every reference Work measures its duration (ReferenceWork._get_duration)."""

    @property
    def options(self):
        return self.group.options

    # Every supports_* flag is answered here, those it lacks too: torch 2.14.1's PyBackend reads a flag through the
    # Python attribute, which for one left to the base class is the base's own property calling back into PyBackend
    # ('RecursionError: maximum recursion depth exceeded' in batch_isend_irecv's supports_coalescing).
    @property
    def supports_shrinking(self) -> bool:
        return True

    @property
    def supports_reconfigure(self) -> bool:
        return True

    @property
    def supports_coalescing(self) -> bool:
        """False, as the ProcessGroup form answers (a Python ProcessGroup has no flags): it coalesces
        (start_coalescing/end_coalescing), and batch_isend_irecv issues each op as for gloo."""
        return False

    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def supports_time_estimate(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts_override=None) -> ReferenceBackend:
        return self.group.shrink(ranks_to_exclude, shrink_flags, opts_override)

    def merge(self, store, opts, rank: int, size: int) -> ReferenceBackend:
        """Backend.merge, as c10d's ProcessGroup.merge_remote_group calls it: this rank's backend of the merged
        group (``rank`` of ``size``, as c10d counted them on ``store``), with ``opts``' timeout."""
        timeout = getattr(opts, "_timeout", None) or self.group.timeout
        return ReferenceBackend(self.group.merged(store, rank, size, timeout))

    def reconfigure(self, opts):
        """The group's reconfigure, where it keeps this rank's number and the group's size: torch reads those from
        this Backend's C++ fields, which a reconfigure made in Python cannot change."""
        place = self.group._place(opts)
        if (place.rank, place.size) != (self.group.rank(), self.group.size()):
            raise RuntimeError(
                f"reference: this reconfigure would make rank {self.group.rank()} of {self.group.size()} rank "
                f"{place.rank} of {place.size}, and this group cannot change its rank or size: it is a c10d Backend "
                "(torch reads both from C++, which Python cannot set); make the group with enable_reconfigure=True "
                "to reconfigure it to another membership")
        return self.group.reconfigure(opts)


def _delegate(name: str, method: str):
    def operation(self, *args):
        return getattr(self.group, method)(*args)

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = f"The backend's {name}: its ReferenceProcessGroup's {method}."
    return operation


for _name, _method in OPERATIONS.items():
    setattr(ReferenceBackend, _name, _delegate(_name, _method))
