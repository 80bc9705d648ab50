"""Contract: a backend says what went wrong (``get_error``), runs its abort hooks on a fault, and recovers by reconfigure (torch 2.14).

torch 2.14's ``Backend.get_error()`` returns an ``ErrorType`` (SUCCESS, TIMEOUT, COMM_ERROR, REMOTE_ERROR);
``register_abort_hook(id, fn)`` / ``unregister_abort_hook(id)`` name what runs when a fault revokes the group.
What a backend reports after ``abort()`` and after a timed-out collective is data of its spec
(``BackendSpec.errors_after_faults``; gloo: SUCCESS both, measured on torch 2.14.1; the default: TIMEOUT
after a timeout). After PyTorch's test/distributed/test_c10d_fault_tolerance.py:

* a healthy group reports SUCCESS (``get_error()`` is called, never looked up with hasattr);
* after ``abort()`` the backend reports what it declares, and a reconfigure with a fresh uuid gives an
  exact all_reduce;
* after a timeout (``set_timeout(2 s)``, rank 0 skips an all_reduce) the ranks that timed out report what
  the backend declares, their next collective raises, and a reconfigure with a fresh uuid recovers;
* the abort hook registered before that timeout runs on the ranks that timed out (within ABORT_HOOK_WAIT_S),
  one unregistered before it does not (gloo has no abort hooks: a gap quoting its error).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx, reinit_process_group
from suites.c10d import fault_tolerance as ft

pytestmark = pytest.mark.needs(collective="all_reduce", feature="get_error")

FAULT_TIMEOUT = timedelta(seconds=2)  # PyTorch's test sets the same
ABORT_HOOK_WAIT_S = 5.0


# ---------------------------------------------------------------- rank side
def error_now() -> str:
    ft.summed()
    return ft.backend().get_error().name


def after_abort() -> dict:
    with ft.reconfigurable_default_group("abort"):
        ft.reconfigure(1200, ft.handles("abort-first"))
        ft.backend().abort()
        found = {"error": ft.backend().get_error().name}
        ft.store_barrier("abort-done")
        ft.reconfigure(1201, ft.handles("abort-recover"))
        found["recovered"] = ft.facts()
        return found


def _skipped_by_rank0(key: str) -> dict:
    """Every rank but 0 all_reduces under FAULT_TIMEOUT while rank 0 waits on ``key``: what they saw."""
    found: dict = {}
    if ctx.rank == 0:
        ctx.store.wait([key], ft.STORE_WAIT)
        return found
    try:
        dist.all_reduce(torch.ones(4, device=ctx.device), async_op=True).wait()
        found["skipped"] = "returned"
    except Exception as exc:
        found["skipped"] = ft.error(exc)
    return found


def _release(key: str) -> None:
    """Every rank but 0 tells rank 0 it is done (the last one's set is the one rank 0 waits for)."""
    if ctx.rank != 0 and ctx.store.add(f"{key}/count", 1) == ctx.world_size - 1:
        ctx.store.set(key, "1")


def after_timeout() -> dict:
    with ft.reconfigurable_default_group("timeout"):
        ft.reconfigure(1300, ft.handles("timeout-first"))
        ft.summed()
        backend = ft.backend()
        backend.set_timeout(FAULT_TIMEOUT)
        found = _skipped_by_rank0("timeout/released")
        if ctx.rank != 0:
            found["error"] = backend.get_error().name
            try:
                dist.all_reduce(torch.ones(4, device=ctx.device))
                found["next"] = "returned"
            except Exception as exc:
                found["next"] = ft.error(exc)
            _release("timeout/released")
        backend.set_timeout(ft.RECONFIGURE_TIMEOUT)
        ft.store_barrier("timeout-observed")
        ft.reconfigure(1301, ft.handles("timeout-recover"))
        found["recovered"] = ft.facts()
        return found


def abort_hooks_on_timeout() -> dict:
    backend = ft.backend()
    fired, unregistered = threading.Event(), threading.Event()
    try:
        backend.register_abort_hook(1, fired.set)
        backend.register_abort_hook(2, unregistered.set)
        backend.unregister_abort_hook(2)
    except Exception as exc:  # every rank fails alike: nothing waits on anyone
        return {"register": ft.error(exc)}
    backend.set_timeout(FAULT_TIMEOUT)
    try:
        found = _skipped_by_rank0("hooks/released")
        if ctx.rank != 0:
            found["fired"] = fired.wait(ABORT_HOOK_WAIT_S)
            found["unregistered fired"] = unregistered.is_set()
            _release("hooks/released")
        return found
    finally:  # the timed-out default group is replaced by a fresh one
        reinit_process_group(f"ft-{ctx.case_id}-hooks-restored")


# ------------------------------------------------------------------ clauses
def test_a_healthy_group_reports_success(world):
    """After an exact all_reduce the backend's get_error() is SUCCESS on every rank."""
    assert world.run(error_now) == ["SUCCESS"] * world.world_size


@pytest.mark.needs(feature="reconfigure")
def test_after_abort_a_reconfigure_recovers(world, backend_spec):
    """After abort() get_error() is what the backend declares; a reconfigure with a fresh uuid reduces exactly."""
    n, declared = world.world_size, backend_spec.errors_after_faults.after_abort
    for rank, found in enumerate(world.run(after_abort)):
        if declared:
            assert found["error"] == declared, f"rank {rank}: get_error() after abort() (declared {declared})"
        assert found["recovered"] == (n, rank, ft.triangle(n)), f"rank {rank}: (size, rank, all_reduce) recovered"


@pytest.mark.needs(feature="reconfigure")
@pytest.mark.min_world_size(2)
def test_after_a_timeout_a_reconfigure_recovers(world, backend_spec):
    """After a timed-out all_reduce: get_error() as declared, the next collective raises, a reconfigure recovers."""
    n, declared = world.world_size, backend_spec.errors_after_faults.after_timeout
    for rank, found in enumerate(world.run(after_timeout)):
        if rank != 0:
            assert found["skipped"] != "returned", f"rank {rank}: the all_reduce rank 0 skipped returned"
            assert found["error"] == declared, f"rank {rank}: get_error() after the timeout (declared {declared})"
            assert found["next"] != "returned", f"rank {rank}: the next all_reduce on the timed-out group returned"
        assert found["recovered"] == (n, rank, ft.triangle(n)), f"rank {rank}: (size, rank, all_reduce) recovered"


@pytest.mark.needs(feature="abort_hooks")
@pytest.mark.min_world_size(2)
def test_abort_hooks_run_when_a_timeout_revokes_the_group(world):
    """A timed-out all_reduce runs the registered abort hook on the ranks that timed out; an unregistered one not."""
    for rank, found in enumerate(world.run(abort_hooks_on_timeout)):
        assert "register" not in found, f"rank {rank}: register_abort_hook: {found.get('register')}"
        if rank != 0:
            assert found["fired"], f"rank {rank}: the abort hook did not run within {ABORT_HOOK_WAIT_S} s"
            assert not found["unregistered fired"], f"rank {rank}: an unregistered abort hook ran"
