"""The controller side of a fault clause: inject a fault of the table while the ranks run their operations.

``run_scenario`` starts the ranks' side (suites/faults/rank_side.py) with ``World.run`` and, on a thread of its
own, waits for every rank's ``ready``, injects the fault on the cut-off rank's host (the last rank), writes
``go``, waits for the ranks that can answer (a frozen rank cannot) to write ``faulted``, heals and writes
``healed``. Healing happens whatever goes wrong, so no fault outlives its case. Two kinds (table.WHEN):
``mid_operation`` (every operation of suites/faults/operations.py on groups whose connections exist) and
``before_connect`` (the first all_reduce of a group made lazily, the fault before its first connection).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from fixtures.world import World
from suites.faults import meeting
from suites.faults import rank_side
from suites.faults.operations import OPERATIONS
from suites.faults.table import WHEN, Fault, Target

TIMEOUT_S = 2.0  # the group's (and the store client's) timeout under a fault: short, so a wait costs seconds
SLACK_S = 3.0  # what a bounded wait may take beyond its timeout on a loaded 2-core machine (scheduling, TCP)
BOUND_S = TIMEOUT_S + SLACK_S + 1.0  # a rank gives up on a call after this (recorded "still running")
# a negative control's timeout: room for a lossy link's retransmissions, which back off (a 256 KiB all_reduce at 3
# ranks under 10 % loss once ran out of a 2 s timeout: 'Timed out waiting 2000ms for recv operation to complete')
CONTROL_TIMEOUT_S = 20.0
# gloo's first collective under lazy init gives up after 5 times its timeout (docs/faults.md): seen, not cut short
FIRST_BOUND_S = 6 * TIMEOUT_S
NUMEL = 64 * 1024  # 256 KiB of float32: a quarter second at the slow link's rate


@dataclass(frozen=True)
class Scenario:
    """What every rank saw before, under and after one fault."""

    fault: str
    when: str  # table.WHEN
    timeout_s: float  # the groups' and the store client's timeout
    cut_rank: int
    ranks: tuple[dict, ...]  # rank_side.under_fault's (or first_collective's) result by rank: operation -> outcome
    missing: tuple[str, ...]  # what the controller did not see within its bound, in words

    @property
    def stuck(self) -> bool:
        """A rank left a backend's call running on a thread: its world must be replaced (a store get left running
        holds a client of its own, which nothing else uses)."""
        return any(outcome.get("stuck") for rank in self.ranks for name, outcome in rank.items()
                   if name != "store_get")

    def outcomes(self, name: str) -> dict[int, dict]:
        """Operation ``name``'s outcome by rank, the ranks it does not involve left out."""
        return {rank: out[name] for rank, out in enumerate(self.ranks)
                if not (out[name]["ok"] and out[name]["value"] == rank_side.NOT_INVOLVED)}



def timeout_for(fault: Fault) -> float:
    """The groups' and the store client's timeout: short under a breaking fault, so a wait costs seconds; with room
    under a negative control, whose operations must fit it."""
    return TIMEOUT_S if fault.breaks else CONTROL_TIMEOUT_S


def payload(fault: Fault, least: int = NUMEL) -> int:
    """Elements of float32 an operation moves: ``least``, or enough for a cut after N bytes to reach it."""
    return max(least, fault.min_payload // 4)


def payloads(fault: Fault) -> dict[str, int]:
    """Elements of float32 each operation moves under ``fault``: the payload, and under a fault that breaks it at least
    what the operation's record asks (operations.Operation.least_payload_under_a_break)."""
    return {op.name: max(payload(fault), op.least_payload_under_a_break if fault.breaks else 0) for op in OPERATIONS}


def run_scenario(world: World, fault: Fault, when: str = "mid_operation", deadline: float = 60.0,
                 lazy_env: Mapping[str, str] | None = None) -> Scenario:
    """``fault`` in ``world``, in the middle of a job or (``before_connect``) before the first connection of a group
    made under the backend's lazy connection switch ``lazy_env``."""
    if when not in WHEN:
        raise ValueError(f"when must be one of {', '.join(WHEN)}, not {when!r}")
    hosts = world.hosts
    assert hosts is not None and world.store is not None, "a fault needs a world on simulated hosts"
    cut = world.world_size - 1
    target = Target(hosts, cut, world.pid_of(cut), int(world.store.port))
    directory = tempfile.mkdtemp(prefix=f"distconform-fault-{fault.name}-")
    stop = threading.Event()
    missing: list[str] = []

    thread = threading.Thread(target=meeting.control,
                              args=(directory, world.world_size, cut, fault, target, hosts, stop, missing,
                                    "in the collective under the fault"), name=f"fault-{fault.name}", daemon=True)
    thread.start()
    try:
        if when == "mid_operation":
            timeout_s = timeout_for(fault)
            results = world.run(rank_side.under_fault, directory, timeout_s, payloads(fault),
                                timeout_s + BOUND_S - TIMEOUT_S, deadline=deadline)
        else:
            results = world.run(rank_side.first_collective, directory, TIMEOUT_S, payload(fault), FIRST_BOUND_S,
                                dict(lazy_env or {}), deadline=deadline)
    finally:
        stop.set()
        thread.join()
        shutil.rmtree(directory, ignore_errors=True)
    return Scenario(fault.name, when, timeout_for(fault) if when == "mid_operation" else TIMEOUT_S, cut,
                    tuple(results), tuple(missing))
