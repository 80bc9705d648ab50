"""The controller side of a fault clause: inject a fault of the table while the ranks run their collective.

``run_scenario`` starts the ranks' side (suites/faults/rank_side.py) with ``World.run`` and, on a thread of its
own, waits for every rank's ``ready``, injects the fault on the cut-off rank's host (the last rank), writes
``go``, waits for the ranks that can answer (a frozen rank cannot) to write ``faulted``, heals and writes
``healed``. Healing happens whatever goes wrong, so no fault outlives its case.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from fixtures.world import World
from suites.faults import rank_side
from suites.faults.table import Fault, Target

TIMEOUT_S = 2.0  # the group's timeout under a fault: short, so a case that only waits costs seconds
SLACK_S = 3.0  # what a bounded wait may take beyond its timeout on a loaded 2-core machine (scheduling, TCP)
CONTROL_WAIT_S = 30.0  # at most, for the ranks' files
NUMEL = 64 * 1024  # 256 KiB of float32: a quarter second at the slow link's rate


@dataclass(frozen=True)
class Scenario:
    """What every rank saw before, under and after one fault."""

    fault: str
    cut_rank: int
    ranks: tuple[dict, ...]  # rank_side.under_fault's result, by rank
    missing: tuple[str, ...]  # what the controller did not see within its bound, in words


def _wait_files(directory: str, names: list[str], stop: threading.Event) -> list[str]:
    """The names still missing after CONTROL_WAIT_S (or once ``stop`` is set)."""
    end = time.monotonic() + CONTROL_WAIT_S
    while time.monotonic() < end and not stop.is_set():
        missing = [n for n in names if not os.path.exists(os.path.join(directory, n))]
        if not missing:
            return []
        time.sleep(0.01)
    return [n for n in names if not os.path.exists(os.path.join(directory, n))]


def run_scenario(world: World, fault: Fault, deadline: float = 60.0) -> Scenario:
    hosts = world.hosts
    assert hosts is not None and world.store is not None, "a fault needs a world on simulated hosts"
    cut = world.world_size - 1
    target = Target(hosts, cut, world.pid_of(cut), int(world.store.port))
    directory = tempfile.mkdtemp(prefix=f"distconform-fault-{fault.name}-")
    stop = threading.Event()
    missing: list[str] = []

    def control() -> None:
        injected = False
        try:
            absent = _wait_files(directory, [f"ready{r}" for r in range(world.world_size)], stop)
            if absent:
                missing.append(f"not ready: {absent}")
                return
            fault.inject(target)
            injected = True
            open(os.path.join(directory, "go"), "w").close()
            answering = [r for r in range(world.world_size) if not (fault.name == "frozen" and r == cut)]
            absent = _wait_files(directory, [f"faulted{r}" for r in answering], stop)
            if absent:
                missing.append(f"still in the collective under the fault after {CONTROL_WAIT_S:.0f} s: {absent}")
        finally:
            if injected:
                fault.heal(target)
            hosts.heal()
            open(os.path.join(directory, "healed"), "w").close()

    thread = threading.Thread(target=control, name=f"fault-{fault.name}", daemon=True)
    thread.start()
    try:
        results = world.run(rank_side.under_fault, directory, TIMEOUT_S, NUMEL, deadline=deadline)
    finally:
        stop.set()
        thread.join()
        shutil.rmtree(directory, ignore_errors=True)
    return Scenario(fault.name, cut, tuple(results), tuple(missing))
