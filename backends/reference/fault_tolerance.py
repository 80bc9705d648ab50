"""The reference's side of torch 2.14's fault-tolerance API: reconfigure handles and requests, the group's error
state with its abort hooks, and the pre/post hooks of every operation.

What torch asks (measured on gloo, suites/c10d/fault_tolerance_measure.py; the clauses in
suites/c10d/test_reconfigure.py, test_fault_signals.py, test_op_hooks.py):

* a group made with ``enable_reconfigure=True`` has no communicator until its first ``reconfigure``: an
  operation before it raises;
* ``get_reconfigure_handle()`` is an opaque string per rank; ``reconfigure(opts)`` makes a new communicator
  of the ranks whose handles ``opts.handles`` lists (a list numbers them by position, a set lets the backend
  choose: here in sorted order, the same on every rank), under ``opts.uuid``, which no earlier reconfigure of
  this group may have used. The request is refused when the uuid was used, the handles repeat, there are
  none, or this rank's own handle is missing (gloo's texts, prefixed ``reference:``);
* ``get_error()`` is SUCCESS until a fault: TIMEOUT once one of the group's operations timed out,
  REMOTE_ERROR once a peer's connection broke, COMM_ERROR after ``abort()`` (what NCCL2 reports); a
  reconfigure clears it;
* abort hooks (``register_abort_hook(id, fn)``) run once when a fault revokes the group (a timeout), before
  its connections close; never on an explicit ``abort()``;
* pre hooks run before each operation is issued, post hooks after, with the same op id (counted per group,
  point-to-point operations included) and the operation's ``HookOpName``.

Nothing here exists before torch 2.14; the reference imports none of it there and no caller reaches it.
"""

from __future__ import annotations

import importlib
import uuid as uuids
from dataclasses import dataclass
from typing import Any, Callable, Iterable

HANDLE_PREFIX = "reference:"
ERROR_TYPES = ("SUCCESS", "TIMEOUT", "COMM_ERROR", "REMOTE_ERROR")  # backends/spec.py ERROR_TYPES, as ErrorType
# the reference's operation names -> torch's HookOpName
HOOK_OP_NAMES = {
    "all_reduce": "ALLREDUCE", "all_reduce_coalesced": "ALLREDUCE", "broadcast": "BROADCAST", "reduce": "REDUCE",
    "all_gather": "ALLGATHER", "all_gather_coalesced": "ALLGATHER", "all_gather_into_tensor_coalesced": "ALLGATHER",
    "gather": "GATHER", "scatter": "SCATTER", "reduce_scatter": "REDUCE_SCATTER",
    "reduce_scatter_tensor_coalesced": "REDUCE_SCATTER", "all_to_all": "ALLTOALL", "all_to_all_single": "ALLTOALL",
    "barrier": "BARRIER", "send": "SEND", "recv": "RECV",
}


def new_handle() -> str:
    """An opaque handle no other group of any process has."""
    return f"{HANDLE_PREFIX}{uuids.uuid4().hex}"


@dataclass(frozen=True)
class Membership:
    """This rank's place in the communicator a reconfigure request describes."""

    rank: int
    size: int


def membership(uuid: int, handles: Iterable[str], own: str, used: set[int]) -> Membership:
    """Check a reconfigure request (uuid, handles) against this rank's handle and the uuids it used; raise
    RuntimeError naming what is wrong, else where this rank stands in the new communicator."""
    if uuid in used:
        raise RuntimeError(f"reference: reconfigure uuid {uuid} was already used; each reconfigure() requires a "
                           "unique uuid")
    ordered = sorted(handles) if isinstance(handles, (set, frozenset)) else list(handles)
    if not ordered:
        raise RuntimeError("reference: Reconfigure requires at least one handle")
    if len(set(ordered)) != len(ordered):
        raise RuntimeError("reference: Reconfigure handles must be unique")
    if own not in ordered:
        raise RuntimeError("reference: the local reconfigure handle is not part of the new communicator")
    return Membership(ordered.index(own), len(ordered))


class FaultState:
    """A group's error (an ErrorType name) and its abort hooks."""

    def __init__(self) -> None:
        self.error = "SUCCESS"
        self._abort_hooks: dict[int, Callable[[], None]] = {}

    def register_abort_hook(self, hook_id: int, hook: Callable[[], None]) -> None:
        self._abort_hooks[hook_id] = hook

    def unregister_abort_hook(self, hook_id: int) -> None:
        self._abort_hooks.pop(hook_id, None)

    def revoked(self, error: str) -> None:
        """A fault revoked the group: remember the first error and run every abort hook (a hook's error must not
        stop the others, nor the revoke)."""
        if self.error != "SUCCESS":
            return
        self.error = error
        for hook in list(self._abort_hooks.values()):
            try:
                hook()
            except Exception:
                pass

    def error_type(self):
        from torch._C._distributed_c10d import ErrorType

        return getattr(ErrorType, self.error)


class OpHooks:
    """Pre and post hooks by id, and the op id they are called with."""

    def __init__(self) -> None:
        self.pre: dict[int, Callable] = {}
        self.post: dict[int, Callable] = {}
        self._next_op_id = 0

    def issue(self, name: str, async_op: bool, root: int, inputs, outputs, submit):
        """Run the pre hooks, ``submit()`` (which returns the Work), then the post hooks; return the Work."""
        op_id, self._next_op_id = self._next_op_id, self._next_op_id + 1  # counted with hooks or without
        if not self.pre and not self.post:
            return submit()
        c10d: Any = importlib.import_module("torch._C._distributed_c10d")  # torch 2.14's names: untyped in 2.13's stubs

        hook_name = getattr(c10d.HookOpName, HOOK_OP_NAMES.get(name, "UNKNOWN"))
        before = c10d.PreHookArgs()
        before.name, before.op_id, before.async_op, before.root = hook_name, op_id, async_op, root
        before.input_tensors, before.output_tensors = list(inputs), list(outputs)
        for hook in list(self.pre.values()):
            hook(before)
        work = submit()
        after = c10d.PostHookArgs()
        after.name, after.op_id, after.async_op, after.work = hook_name, op_id, async_op, work
        for hook in list(self.post.values()):
            hook(after)
        return work
