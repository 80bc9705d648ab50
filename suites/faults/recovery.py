"""The controller side of the recovery clauses: partition the last rank's host while the ranks run
suites/faults/recovery_rank.py, heal once the reachable ranks have reconfigured without it.

As suites/faults/scenario.py does for the fault clauses, the controller and the ranks meet in a folder (the
network is what the partition cuts), and a thread of the controller's own steps the fault: it waits for every
rank's ``ready``, partitions the last rank's host (the table's ``partition``) and writes ``go``; once every rank
has written ``detected`` and every reachable rank ``shrunk`` (or its bound passed) it heals and writes ``healed``.
Healing happens whatever goes wrong, so no partition outlives its case.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass

from fixtures.world import World
from suites.faults import meeting
from suites.faults import recovery_rank
from suites.faults.scenario import TIMEOUT_S
from suites.faults.table import TABLE, Target

DETECT_TIMEOUT_S = TIMEOUT_S  # the group's timeout while the host is cut off (the fault clauses' 2 s)
RECONFIGURE_TIMEOUT_S = 15.0  # one reconfigure (rendezvous of the new communicator) at most
RUN_DEADLINE_S = 150.0  # the whole case on the ranks: three reconfigures, the detection and every file wait


@dataclass(frozen=True)
class Recovery:
    """What every rank saw of one partition, its detection, the shrink, the healing and the growth back."""

    cut_rank: int
    ranks: tuple[dict, ...]  # recovery_rank.partition_then_grow_back's result, by rank
    missing: tuple[str, ...]  # what the controller did not see within its bound, in words



def run_recovery(world: World) -> Recovery:
    hosts = world.hosts
    assert hosts is not None and world.store is not None, "a partition needs a world on simulated hosts"
    ranks = list(range(world.world_size))
    cut = ranks[-1]
    partition = TABLE["partition"]
    target = Target(hosts, cut, world.pid_of(cut), int(world.store.port))
    directory = tempfile.mkdtemp(prefix="distconform-recovery-")
    stop = threading.Event()
    missing: list[str] = []

    def control() -> None:
        injected = False
        try:
            absent = meeting.wait_files(directory, [f"ready{r}" for r in ranks], stop)
            if absent:
                missing.append(f"not ready: {absent}")
                return
            partition.inject(target)
            injected = True
            open(os.path.join(directory, "go"), "w").close()
            absent = meeting.wait_files(directory, [f"detected{r}" for r in ranks] + [f"shrunk{r}" for r in ranks], stop)
            if absent:
                missing.append(f"not past the partition within {meeting.CONTROL_WAIT_S:.0f} s: {absent}")
        finally:
            if injected:
                partition.heal(target)
            hosts.heal()
            open(os.path.join(directory, "healed"), "w").close()

    thread = threading.Thread(target=control, name="recovery-control", daemon=True)
    thread.start()
    try:
        results = world.run(recovery_rank.partition_then_grow_back, directory, DETECT_TIMEOUT_S,
                            RECONFIGURE_TIMEOUT_S, deadline=RUN_DEADLINE_S)
    finally:
        stop.set()
        thread.join()
        shutil.rmtree(directory, ignore_errors=True)
    return Recovery(cut, tuple(results), tuple(missing))
