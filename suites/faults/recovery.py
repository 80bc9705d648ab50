"""The controller side of the recovery clauses: cut one rank's host off with a fault of the table while the ranks
run suites/faults/recovery_rank.py, heal once the reachable ranks have reconfigured without it.

As suites/faults/scenario.py does for the fault clauses, the controller and the ranks meet in a folder (the
network is what the fault cuts), and a thread of the controller's own steps the fault: it waits for every rank's
``ready``, injects the fault on the cut rank's host (``CUTS``: the last rank or a middle one; ``FAULTS``: a silent
``partition`` or ``refused`` resets) and writes ``go``; once every rank has written ``detected`` and every
reachable rank ``shrunk`` (or its bound passed) it heals and writes ``healed``. Healing happens whatever goes
wrong, so no fault outlives its case.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

from fixtures.world import World
from suites.faults import meeting
from suites.faults import recovery_rank
from suites.faults.scenario import TIMEOUT_S
from suites.faults.table import TABLE, Fault, Target

DETECT_TIMEOUT_S = TIMEOUT_S  # the group's timeout while the host is cut off (the fault clauses' 2 s)
# one reconfigure (the new communicator's rendezvous) at most, and the reconfigured group's timeout: each took
# 0.00-0.08 s on gloo and the reference (2 shared cores); what fails waits it out (the seeded bugs' cost in the gallery)
RECONFIGURE_TIMEOUT_S = 5.0
RUN_DEADLINE_S = 150.0  # the whole case on the ranks: three reconfigures, the detection and every file wait


@dataclass(frozen=True)
class Cut:
    """Which rank's host the fault cuts off: the survivors of the shrink are renumbered around it."""

    name: str
    rank_of: Callable[[int], int]  # world size -> the cut rank
    min_world_size: int  # below it the cut rank is not what the name says (a middle rank needs ranks on both sides)


CUTS: dict[str, Cut] = {cut.name: cut for cut in (
    Cut("last", lambda n: n - 1, 2),  # the survivors keep their numbers
    # torch's test_shrink_exclude_middle_rank: the ranks after it move down by one on the shrink, back up on the growth
    Cut("middle", lambda n: n // 2, 3),
)}
# a silent partition (only a timeout ends a wait) and resets (the backend's connections refused at once): the table's
# one fault of each kind that breaks a collective, as suites/faults/conftest.py DEFAULT_FAULTS
FAULTS: tuple[str, ...] = ("partition", "refused")


@dataclass(frozen=True)
class Recovery:
    """What every rank saw of one fault, its detection, the shrink, the healing and the growth back."""

    fault: str
    cut_rank: int
    ranks: tuple[dict, ...]  # recovery_rank.cut_then_grow_back's result, by rank
    missing: tuple[str, ...]  # what the controller did not see within its bound, in words

    @property
    def reachable(self) -> list[int]:
        """The world ranks that reconfigure without the cut one, in order."""
        return [r for r in range(len(self.ranks)) if r != self.cut_rank]

    def shrunk_rank(self, rank: int) -> int:
        """World rank ``rank``'s number in the group without the cut rank: the ranks after it move down by one."""
        return rank - (rank > self.cut_rank)


def _control(directory: str, ranks: list[int], fault: Fault, target: Target, stop: threading.Event,
             missing: list[str]) -> None:
    """The controller's steps (a thread of its own): inject once every rank is ready, heal once every rank is past
    the fault, whatever went wrong; what it did not see goes to ``missing``."""
    injected = False
    try:
        absent = meeting.wait_files(directory, [f"ready{r}" for r in ranks], stop)
        if absent:
            missing.append(f"not ready: {absent}")
            return
        fault.inject(target)
        injected = True
        meeting.mark(directory, "go")
        absent = meeting.wait_files(directory, [f"detected{r}" for r in ranks] + [f"shrunk{r}" for r in ranks], stop)
        if absent:
            missing.append(f"not past the {fault.name} within {meeting.CONTROL_WAIT_S:.0f} s: {absent}")
    finally:
        if injected:
            fault.heal(target)
        target.hosts.heal()
        meeting.mark(directory, "healed")


def run_recovery(world: World, fault: str = "partition", cut: str = "last") -> Recovery:
    hosts = world.hosts
    assert hosts is not None and world.store is not None, "a fault needs a world on simulated hosts"
    ranks = list(range(world.world_size))
    cut_rank = CUTS[cut].rank_of(world.world_size)
    target = Target(hosts, cut_rank, world.pid_of(cut_rank), int(world.store.port))
    directory = tempfile.mkdtemp(prefix=f"distconform-recovery-{fault}-{cut}-")
    stop = threading.Event()
    missing: list[str] = []
    thread = threading.Thread(target=_control, args=(directory, ranks, TABLE[fault], target, stop, missing),
                              name="recovery-control", daemon=True)
    thread.start()
    try:
        results = world.run(recovery_rank.cut_then_grow_back, directory, cut_rank, DETECT_TIMEOUT_S,
                            RECONFIGURE_TIMEOUT_S, deadline=RUN_DEADLINE_S)
    finally:
        stop.set()
        thread.join()
        shutil.rmtree(directory, ignore_errors=True)
    return Recovery(fault, cut_rank, tuple(results), tuple(missing))
