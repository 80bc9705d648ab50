"""Where a fault's controller and its ranks meet: a folder of marker files, never the network the fault cuts.

Each rank writes ``<step><rank>`` when it reaches a step (``mark``) and waits for the controller's files
(``wait``: ``go`` once the fault is in place, ``healed``); the controller waits for every rank's file
(``wait_files``), injects, heals. Every wait is bounded. ``timed`` is how every operation under a fault is
measured, on either side: its seconds and its value, or its error's type and text. One home for the three
scenarios (scenario.py, rpc_scenario.py, recovery.py) and their rank sides.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

FILE_WAIT_S = 60.0  # a rank waits at most this for the controller's file
CONTROL_WAIT_S = 30.0  # the controller waits at most this for the ranks' files of one step


def mark(directory: str, name: str) -> None:
    open(os.path.join(directory, name), "w").close()


def wait(directory: str, name: str, who: str, wait_s: float = FILE_WAIT_S) -> None:
    """Until the controller writes ``name``; TimeoutError naming ``who`` (the waiting rank) after ``wait_s``."""
    end = time.monotonic() + wait_s
    while not os.path.exists(os.path.join(directory, name)):
        if time.monotonic() > end:
            raise TimeoutError(f"{who}: no {name!r} from the fault controller within {wait_s:.0f} s")
        time.sleep(0.01)


def meet(directory: str, step: str, rank: int, world_size: int, wait_s: float = FILE_WAIT_S) -> None:
    """Mark ``<step><rank>`` and wait until every rank has: the ranks leave together (a file barrier, off the network).

    What a rank does before the fault runs under the fault's short group timeout (2 s); a rank that reaches a
    collective seconds after its peer (a loaded machine: CI's torch 2.14.1 lane once timed rank 0 out in the first
    all_reduce of a group before any fault, and rank 1's send then hit the closed connection) fails the scenario for
    the machine's sake, not the backend's."""
    mark(directory, f"{step}{rank}")
    missing = wait_files(directory, [f"{step}{r}" for r in range(world_size)], threading.Event(), wait_s)
    if missing:
        raise TimeoutError(f"rank {rank}: ranks' {missing} not marked within {wait_s:.0f} s")


def wait_files(directory: str, names: list[str], stop: threading.Event, wait_s: float = CONTROL_WAIT_S) -> list[str]:
    """The names still missing after ``wait_s`` (or once ``stop`` is set)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end and not stop.is_set():
        missing = [n for n in names if not os.path.exists(os.path.join(directory, n))]
        if not missing:
            return []
        time.sleep(0.01)
    return [n for n in names if not os.path.exists(os.path.join(directory, n))]


def timed(call: Callable[[], Any]) -> dict:
    """How a call ended: seconds, and its value or the error's type, whether it is a RuntimeError, and its text."""
    start = time.perf_counter()
    try:
        value = call()
    except Exception as exc:  # the error is the measurement
        return {"ok": False, "seconds": time.perf_counter() - start, "type": type(exc).__name__,
                "runtime_error": isinstance(exc, RuntimeError), "error": str(exc)[:2000]}
    return {"ok": True, "seconds": time.perf_counter() - start, "value": value}


def control(directory: str, world_size: int, cut: int, fault, target, hosts, stop: threading.Event,
            missing: list[str], under: str) -> None:
    """The controller's side of one fault (run on a thread of its own): once every rank is ``ready``, inject
    ``fault`` on ``target`` and write ``go``; wait for every rank that can answer (a frozen one cannot) to write
    ``faulted``; then heal, whatever went wrong, and write ``healed``. What it did not see goes to ``missing``
    (``under``: what the ranks were doing, for the message)."""
    injected = False
    try:
        absent = wait_files(directory, [f"ready{r}" for r in range(world_size)], stop)
        if absent:
            missing.append(f"not ready: {absent}")
            return
        fault.inject(target)
        injected = True
        mark(directory, "go")
        answering = [r for r in range(world_size) if not (fault.name == "frozen" and r == cut)]
        absent = wait_files(directory, [f"faulted{r}" for r in answering], stop)
        if absent:
            missing.append(f"still {under} after {CONTROL_WAIT_S:.0f} s: {absent}")
    finally:
        if injected:
            fault.heal(target)
        hosts.heal()
        mark(directory, "healed")
