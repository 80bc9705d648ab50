"""The rank side of the fault clauses: one collective before, under and after a fault, steered by files.

The controller (suites/faults/scenario.py) and the ranks meet in a folder, not over the network the fault
cuts: each rank writes ``ready<r>`` once its group's connections exist, waits for ``go`` (the fault is in
place), times its collective under the fault, writes ``faulted<r>``, waits for ``healed``, then calls once
more on the same group and once on a new one. Every wait on a file is bounded.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from fixtures.rank import ctx

FILE_WAIT_S = 60.0


def _mark(directory: str, name: str) -> None:
    open(os.path.join(directory, name), "w").close()


def _wait(directory: str, name: str) -> None:
    end = time.monotonic() + FILE_WAIT_S
    while not os.path.exists(os.path.join(directory, name)):
        if time.monotonic() > end:
            raise TimeoutError(f"rank {ctx.rank}: no {name!r} from the fault controller within {FILE_WAIT_S:.0f} s")
        time.sleep(0.01)


def _timed(call: Callable[[], Any]) -> dict:
    """How a call ended: seconds, and its value or the error's type (and base types) and text."""
    start = time.perf_counter()
    try:
        value = call()
    except Exception as exc:  # the error is the measurement
        return {"ok": False, "seconds": time.perf_counter() - start, "type": type(exc).__name__,
                "runtime_error": isinstance(exc, RuntimeError), "error": str(exc)[:2000]}
    return {"ok": True, "seconds": time.perf_counter() - start, "value": value}


def _all_reduce(group, numel: int) -> float:
    """all_reduce of ones: every element is the group's size when it worked (the first element is returned)."""
    tensor = torch.ones(numel)
    dist.all_reduce(tensor, group=group)
    return float(tensor[0])


def under_fault(directory: str, timeout_s: float, numel: int) -> dict:
    group = dist.new_group(timeout=timedelta(seconds=timeout_s))
    fresh = None
    try:
        _all_reduce(group, numel)  # the group's connections exist: the fault comes in the middle of a job
        _mark(directory, f"ready{ctx.rank}")
        _wait(directory, "go")
        under = _timed(lambda: _all_reduce(group, numel))
        _mark(directory, f"faulted{ctx.rank}")
        _wait(directory, "healed")
        after = _timed(lambda: _all_reduce(group, numel))
        fresh = dist.new_group(timeout=timedelta(seconds=timeout_s))
        renewed = _timed(lambda: _all_reduce(fresh, numel))
    finally:
        for made in (group, fresh):
            if made is not None:
                try:
                    dist.destroy_process_group(made)
                except Exception:  # a dead group may refuse; the world's default group is untouched
                    pass
    return {"under": under, "after": after, "renewed": renewed}
