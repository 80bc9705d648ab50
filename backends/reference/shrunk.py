"""The reference's ``shrink_group``: the shrunk group as a c10d ``Backend`` of torch's own ProcessGroup.

torch's ``shrink_group`` asks the group's device backend (``_get_backend(cpu)``: the reference answers with the
group itself) for ``supports_shrinking`` and calls its ``shrink(ranks_to_exclude, flags, options)``, then
registers what that returns as the CPU backend of a ProcessGroup it makes (``ProcessGroup._register_backend``):
it must be a C++ ``Backend``. A Python subclass of ``Backend`` constructs from torch 2.14 on (2.13: "No
constructor defined!"), so the reference shrinks from 2.14 on and declares it cannot before (its spec's gap).

``ShrunkBackend`` is that Backend: the remaining ranks' own ReferenceProcessGroup, made over the parent's store
under a prefix of its own, answers every operation. Its rank and size are fixed when it is made, which is all
torch's ProcessGroup reads of them (a reconfigure, which changes them, stays on the ProcessGroup form: a
Python Backend cannot change the C++ size torch reads, docs/fault-tolerance.md).
"""

from __future__ import annotations

# torch 2.14 lets Python subclass c10d's Backend (a constructor that 2.13's binding lacks)
try:
    from torch._C._distributed_c10d import Backend as _CBackend

    _CBackend(0, 1)
    AVAILABLE = True
except (ImportError, TypeError, RuntimeError):
    _CBackend = object  # type: ignore[assignment,misc]
    AVAILABLE = False

# the operations torch's ProcessGroup hands its backend, by the names PyBackend looks up in Python -> the
# ReferenceProcessGroup method that does it (the same arguments in the same order)
OPERATIONS = {name: name for name in (
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "allgather_coalesced",
    "all_gather_single", "all_gather_single_coalesced", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_single_coalesced", "alltoall", "all_to_all_single", "barrier", "send",
    "recv", "recv_anysource", "_start_coalescing", "_end_coalescing")} | {
    "_allgather_base": "all_gather_single", "_reduce_scatter_base": "reduce_scatter_single",
    "alltoall_base": "all_to_all_single"}


class ShrunkBackend(_CBackend):
    """A shrunk group's CPU backend: every operation answered by ``group``, a ReferenceProcessGroup of the
    remaining ranks."""

    def __init__(self, group) -> None:
        super().__init__(group.rank(), group.size())
        self.group = group

    def getBackendName(self) -> str:  # torch's name() asks it (INTERNAL ASSERT without it)
        return "reference"

    def _get_backend_name(self) -> str:
        return "reference"

    def _set_group_uid(self, name: str) -> None:  # c10d names the shrunk ProcessGroup: its backend is told so
        self.group._set_group_name(name)

    @property
    def options(self):
        return self.group.options

    def set_timeout(self, timeout) -> None:
        self.group.timeout = timeout

    def abort(self) -> None:
        self.group.abort()

    def shutdown(self) -> None:
        self.group.shutdown()

    @property
    def supports_shrinking(self) -> bool:
        return True

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts_override=None) -> ShrunkBackend:
        return self.group.shrink(ranks_to_exclude, shrink_flags, opts_override)


def _delegate(name: str, method: str):
    def operation(self, *args):
        return getattr(self.group, method)(*args)

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = f"The shrunk group's {name}: its ReferenceProcessGroup's {method}."
    return operation


for _name, _method in OPERATIONS.items():
    setattr(ShrunkBackend, _name, _delegate(_name, _method))
