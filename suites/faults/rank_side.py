"""The rank side of the fault clauses: every operation before, under and after a fault, steered by files.

The controller (suites/faults/scenario.py) and the ranks meet in a folder, not over the network the fault
cuts: each rank writes ``ready<r>`` once its groups' connections exist, waits for ``go`` (the fault is in
place), runs the operations of suites/faults/operations.py under the fault at once (each on a group of its own,
from a thread of its own, timed), then, one after the other, aborts a group and destroys another while a
collective waits on each, and shrinks a third over the reachable ranks; it writes ``faulted<r>``, waits for
``healed``, then calls all_reduce once more on the group that met the fault and once on a new one.

Every wait is bounded: a call still running after ``bound_s`` is recorded as such ("stuck") and left behind
on its thread; the controller then replaces the world (a thread stuck in a backend is beyond repair).
``first_collective`` is the other scenario: the fault comes before the first connection of a group made under the
backend's lazy connection switch (gloo: ``TORCH_GLOO_LAZY_INIT=1``), one all_reduce under it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from datetime import timedelta
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch
import torch.distributed as dist

from fixtures.rank import ctx, group_names_drawn
from suites.faults import meeting, recorder_view
from suites.faults.operations import NUMBERED, PEER

PENDING_S = 0.3  # how long a collective waits under the fault before its group is aborted or destroyed
STORE_KEY = "distconform-fault/{rank}"
NOT_INVOLVED = "not involved"  # the value of a call a rank takes no part in (p2p, shrink)




class Timed:
    """A call on a thread of its own, timed; ``result(bound_s)`` says how it ended, or that it still runs."""

    def __init__(self, call: Callable[[], Any], name: str) -> None:
        self.outcome: dict | None = None
        self.started = time.monotonic()
        self.thread = threading.Thread(target=lambda: setattr(self, "outcome", meeting.timed(call)),
                                       name=f"fault-{name}", daemon=True)
        self.thread.start()

    def result(self, bound_s: float) -> dict:
        self.thread.join(max(0.0, self.started + bound_s - time.monotonic()))
        if self.outcome is not None:
            return self.outcome
        return {"ok": False, "stuck": True, "seconds": time.monotonic() - self.started, "type": "still running",
                "runtime_error": False, "error": f"still running after {bound_s:g} s (left on its thread)"}


def _ended(wait: Timed) -> bool:
    return wait.outcome is not None


def _bounded(call: Callable[[], Any], name: str, bound_s: float) -> dict:
    return Timed(call, name).result(bound_s)


# ---------------------------------------------------------------- the operations (suites/faults/operations.py)
def _all_reduce(group, numel: int) -> float:
    """all_reduce of ones: every element is the group's size when it worked (the first element is returned)."""
    tensor = torch.ones(numel)
    dist.all_reduce(tensor, group=group)
    return float(tensor[0])


def _barrier(group, numel: int) -> bool:
    dist.barrier(group=group)
    return True


# seconds the cut-off rank's isend call took before it returned its Work (or raised), the last p2p's: the
# sender's wait is in Work.wait(), so a send into a connection nobody reads must not hold the call itself
_ISEND_SECONDS: list[float] = []


def _p2p(group, numel: int) -> float | str:
    """The cut-off rank isends its rank + 1 to rank 0 and waits for it (the first element received is returned)."""
    cut = ctx.world_size - 1
    if ctx.rank == cut:
        _ISEND_SECONDS.clear()
        # made before the clock starts: faulting in 16 MB of fresh pages took up to 0.22 s of a loaded machine's
        # time (the isend itself at most 0.055 s), which once read as a call that waited (0.61 s, CI's lane)
        payload = torch.full((numel,), float(cut + 1))
        started = time.monotonic()
        try:
            work = dist.isend(payload, dst=PEER, group=group)
        finally:
            _ISEND_SECONDS.append(time.monotonic() - started)
        work.wait()
        return float(cut + 1)
    if ctx.rank == PEER:
        tensor = torch.zeros(numel)
        dist.recv(tensor, src=cut, group=group)
        return float(tensor[0])
    return NOT_INVOLVED


def _store_get(store, numel: int) -> str:
    return store.get(STORE_KEY.format(rank=ctx.rank)).decode()


def _store(timeout_s: float):
    """A store client of its own (a timed-out request must not leave the world's client reading a stale reply)."""
    assert ctx.config is not None, "a rank of a world"
    host, port = ctx.config.store
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    store.set(STORE_KEY.format(rank=ctx.rank), f"rank {ctx.rank}")
    return store


OPERATIONS: dict[str, Callable[[Any, int], Any]] = {
    "all_reduce": _all_reduce, "barrier": _barrier, "p2p": _p2p, "store_get": _store_get}
GROUPS = ("all_reduce", "barrier", "p2p", "abort", "destroy", "shrink")  # a group of its own each


# ---------------------------------------------------------------- ending a group under the fault
def _pending_then(group, numel: int, end: Callable[[], None], bound_s: float) -> dict:
    """Start an all_reduce that waits under the fault, then time ``end()`` (abort or destroy) on its thread.

    The all_reduce is issued from a thread of its own: a Python ProcessGroup may wait inside the call itself."""
    Timed(lambda: dist.all_reduce(torch.ones(numel), group=group, async_op=True), "pending")
    time.sleep(PENDING_S)
    return _bounded(end, "end", bound_s)


def _shrink(group, numel: int) -> float | str:
    """The reachable ranks shrink the group to themselves and all_reduce on it (the cut-off rank is not involved)."""
    cut = ctx.world_size - 1
    if ctx.rank == cut:
        return NOT_INVOLVED
    shrunk = dist.shrink_group([cut], group=group)
    try:
        return _all_reduce(shrunk, numel)
    finally:
        dist.destroy_process_group(shrunk)


def _draw_the_names_the_shrink_drew(directory: str) -> None:
    """The cut-off rank draws the group names its peers' shrink drew, so that the next group every rank makes
    has one name on all of them.

    torch 2.14's shrink_group draws a name (``_world.group_count``) on the ranks that shrink only, the excluded
    rank staying out as torch requires; a new_group after it then has one name on the shrinking ranks and
    another on the excluded one, and its rendezvous fails ('rank 0 published no world token within 2 s: ...
    /default_pg/0/0//7//cpu//reference/token'). The scenario's excluded rank lives on (the fault heals), so it
    catches up with rank 0's count, read from the meeting directory (marked before the fault healed)."""
    mine = group_names_drawn()
    if mine is None or ctx.rank != ctx.world_size - 1:
        return
    marks = [name for name in os.listdir(directory) if name.startswith("names0-")]
    theirs = int(marks[0].split("-", 1)[1]) if marks else mine
    for _ in range(theirs - mine):
        dist.distributed_c10d._process_group_name([], use_hashed_name=False)


def _destroy(groups) -> None:
    for group in groups:
        try:
            dist.destroy_process_group(group)
        except Exception:  # a dead group may refuse; the world's default group is untouched
            pass


def under_fault(directory: str, timeout_s: float, numels: dict[str, int], bound_s: float) -> dict:
    """Every operation under the fault, the group endings, then all_reduce after healing: outcomes by name.
    ``numels``: the elements each operation moves (scenario.payloads); the group endings' all_reduces the all_reduce's."""
    numel = numels["all_reduce"]
    timeout = timedelta(seconds=timeout_s)
    groups = {name: dist.new_group(timeout=timeout) for name in GROUPS}
    store = _store(timeout_s)
    targets = {**groups, "store_get": store}
    since = {name: recorder_view.newest_record(groups[name]) for name in NUMBERED}
    # each operation before the fault starts on every rank together (meeting.meet): it runs under the fault's short
    # timeout, which a rank that came seconds late (a loaded machine) would exceed before any fault
    for name, call in OPERATIONS.items():  # every connection exists: the fault comes in the middle of a job
        meeting.meet(directory, f"first-{name}-", ctx.rank, ctx.world_size)
        call(targets[name], numels[name])
    for name in NUMBERED:  # a second one completed before the fault: the recorder's history
        meeting.meet(directory, f"second-{name}-", ctx.rank, ctx.world_size)
        OPERATIONS[name](groups[name], numels[name])
    for name in ("abort", "destroy"):
        meeting.meet(directory, f"first-{name}-", ctx.rank, ctx.world_size)
        _all_reduce(groups[name], numel)
    recorded = {name: {"before": recorder_view.view(groups[name], since[name])} for name in NUMBERED}
    meeting.mark(directory, f"ready{ctx.rank}")
    meeting.wait(directory, "go", f"rank {ctx.rank}")
    waits = {name: Timed(functools.partial(call, targets[name], numels[name]), name)
             for name, call in OPERATIONS.items()}
    # read while each waits: the entries once the call under the fault is recorded
    under = recorder_view.while_waiting(
        {name: recorder_view.Waiting(groups[name], since[name], len(recorded[name]["before"]["entries"]) + 1,
                                     functools.partial(_ended, waits[name])) for name in NUMBERED}, bound_s)
    for name, seen in under.items():
        recorded[name]["under"] = seen
    # one after the other, from this thread's view: c10d's bookkeeping of groups is not made for threads
    out: dict[str, dict] = {
        "abort": _pending_then(groups["abort"], numel,
                               lambda: dist.distributed_c10d._abort_process_group(groups["abort"]), bound_s),
        "destroy": _pending_then(groups["destroy"], numel,
                                 lambda: dist.destroy_process_group(groups["destroy"]), bound_s),
        "shrink": _bounded(lambda: _shrink(groups["shrink"], numel), "shrink", bound_s),
    }
    out.update({name: wait.result(bound_s) for name, wait in waits.items()})
    if ctx.rank == ctx.world_size - 1:  # the p2p's sender: how long its isend call took, if it returned at all
        out["isend"] = {"ok": bool(_ISEND_SECONDS), "value": None,
                        "seconds": _ISEND_SECONDS[0] if _ISEND_SECONDS else out["p2p"]["seconds"]}
    for name in NUMBERED:
        recorded[name]["ended"] = recorder_view.view(groups[name], since[name])
    out["recorder"] = recorded
    meeting.mark(directory, f"names{ctx.rank}-{group_names_drawn()}")  # before "faulted": the controller waits for those
    meeting.mark(directory, f"faulted{ctx.rank}")
    meeting.wait(directory, "healed", f"rank {ctx.rank}")
    _draw_the_names_the_shrink_drew(directory)
    out["after"] = _bounded(lambda: _all_reduce(groups["all_reduce"], numel), "after", bound_s)
    fresh = dist.new_group(timeout=timeout)
    out["renewed"] = _bounded(lambda: _all_reduce(fresh, numel), "renewed", bound_s)
    if not any(result.get("stuck") for result in out.values()):  # a group with a stuck call stays as it is
        _destroy([groups[name] for name in GROUPS if name not in ("abort", "destroy")] + [fresh])
    return out


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """``variables`` set in this rank's environment inside the block (a backend's switch read when a group or an
    agent is made), each restored to what it was after it."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def first_collective(directory: str, timeout_s: float, numel: int, bound_s: float, lazy_env: dict) -> dict:
    """The fault before the group's first connection: a group made under the backend's lazy connection switch
    (``lazy_env``, BackendSpec.lazy_connect_env: gloo's TORCH_GLOO_LAZY_INIT=1, read when a group is made), then its
    first all_reduce under the fault."""
    with environment(lazy_env):
        group = dist.new_group(timeout=timedelta(seconds=timeout_s))
    meeting.mark(directory, f"ready{ctx.rank}")
    meeting.wait(directory, "go", f"rank {ctx.rank}")
    held = [group]  # the group's only reference here: its ending below drops it on a thread of its own
    del group
    out = {"all_reduce": _bounded(lambda: _all_reduce(held[0], numel), "first", bound_s)}
    meeting.mark(directory, f"faulted{ctx.rank}")
    if not out["all_reduce"].get("stuck"):
        # ending the group is bounded too, each step on a thread of its own: destroy_process_group, then dropping its
        # last reference, whose C++ destructor may wait on the backend's threads (gloo's lazily connected group under
        # a cut after N bytes, ws3: one of them never returned, so the rank outlived the world's deadline after its
        # all_reduce had raised)
        out["destroyed"] = _bounded(lambda: _destroy(held), "destroyed", bound_s)
        if not out["destroyed"].get("stuck"):
            out["dropped"] = _bounded(held.clear, "dropped", bound_s)
    return out
