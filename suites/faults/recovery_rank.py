"""The rank side of the recovery clauses (torch 2.14): cut one rank off, detect, reconfigure without it, heal, grow
back (suites/faults/test_partition_recovery.py).

Every rank remakes the world's default group with ``enable_reconfigure=True`` (suites/c10d/fault_tolerance.py)
and reconfigures it with every rank's handle; it registers an abort hook where the backend takes one and writes
``ready<r>``. The controller (suites/faults/recovery.py) cuts one rank's host off (the last or a middle one, by a
partition or resets) and writes ``go``. Every rank then all_reduces under a short timeout (the detection), reads
``get_error()``, waits briefly for its abort hook and writes ``detected<r>``; the reachable ranks exchange handles
over the store (the store is on the switch, which they still reach) and reconfigure without the cut rank under a
fresh uuid, numbered by their order (the ranks after a middle one move down by one), then write ``shrunk<r>``.
Once the controller has healed (``healed``) every rank takes its handle again and all of them reconfigure to the
whole world under another fresh uuid, in world order: each numbered as before. Each step is timed and its outcome kept, so a step that
fails leaves the later ones to run and every clause reads its own step.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.c10d import fault_tolerance as ft
from suites.faults import meeting

FIRST_UUID, SHRINK_UUID, GROW_UUID = 3600, 3601, 3602  # one group, three reconfigures: each uuid fresh
BROADCAST_VALUE = 42.0
ABORT_HOOK_WAIT_S = 5.0  # as suites/c10d/test_fault_signals.py: the hook runs before the timed-out call raises


def _handles(key: str, members: list[int]) -> list[str]:
    """The reconfigure handles of ``members`` (world ranks), in their order, exchanged over the case store."""
    ctx.store.set(f"{key}/{ctx.rank}", dist._get_reconfigure_handle())
    ctx.store.wait([f"{key}/{r}" for r in members], ft.STORE_WAIT)
    return [ctx.store.get(f"{key}/{r}").decode() for r in members]


def _reconfigure(uuid: int, key: str, members: list[int], timeout: timedelta) -> list:
    """Reconfigure to ``members`` under ``uuid``; then (size, rank, all_reduce, broadcast from group rank 0)."""
    dist._reconfigure(uuid, _handles(key, members), timeout=timeout).wait()
    tensor = torch.full((4,), BROADCAST_VALUE if dist.get_rank() == 0 else 0.0, device=ctx.device)
    dist.broadcast(tensor, group_src=0)
    return [*ft.facts(), tensor[0].item()]


def _register_abort_hook(backend, fired: threading.Event) -> str:
    """'' once registered; else the backend's refusal (gloo has no abort hooks)."""
    try:
        backend.register_abort_hook(1, fired.set)
    except Exception as exc:
        return ft.error(exc)
    return ""


def _error_type(backend) -> str:
    try:
        return backend.get_error().name
    except Exception as exc:
        return ft.error(exc)


def cut_then_grow_back(directory: str, cut_rank: int, detect_timeout_s: float, reconfigure_timeout_s: float) -> dict:
    everyone = list(range(ctx.world_size))
    reachable = [r for r in everyone if r != cut_rank]  # the controller cuts this rank's host off
    timeout = timedelta(seconds=reconfigure_timeout_s)
    found: dict = {}
    with ft.reconfigurable_default_group("recovery"):
        found["first"] = meeting.timed(lambda: _reconfigure(FIRST_UUID, "recovery-first", everyone, timeout))
        backend = ft.backend()
        fired = threading.Event()
        found["hook refused"] = _register_abort_hook(backend, fired)
        meeting.mark(directory, f"ready{ctx.rank}")
        meeting.wait(directory, "go", f"rank {ctx.rank}")
        backend.set_timeout(timedelta(seconds=detect_timeout_s))
        found["under"] = meeting.timed(ft.summed)
        found["error"] = _error_type(backend)
        found["hook fired"] = not found["hook refused"] and fired.wait(ABORT_HOOK_WAIT_S)
        backend.set_timeout(timeout)
        meeting.mark(directory, f"detected{ctx.rank}")
        if ctx.rank in reachable:
            found["shrink"] = meeting.timed(lambda: _reconfigure(SHRINK_UUID, "recovery-shrink", reachable, timeout))
        meeting.mark(directory, f"shrunk{ctx.rank}")
        meeting.wait(directory, "healed", f"rank {ctx.rank}")
        found["grow"] = meeting.timed(lambda: _reconfigure(GROW_UUID, "recovery-grow", everyone, timeout))
    return found
