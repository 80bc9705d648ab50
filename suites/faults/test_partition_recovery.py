"""Contract: after a fault cuts one rank's host off mid-job, the others detect it within their timeout, reconfigure
without it and continue exactly; once healed, the whole world comes back by reconfigure, exact again (torch 2.14).

Issue 36's end-to-end scenario, on torch 2.14's fault-tolerance API (docs/fault-tolerance.md) and the fault area's
simulated hosts (docs/faults.md): a private world with every rank on a host of its own, the store on the switch.
Every rank remakes the default group with ``enable_reconfigure=True`` and reconfigures it with every handle; the
controller cuts one rank's host off, the last rank's or a middle one's (suites/faults/recovery.py ``CUTS``), by one
of the table's faults of each kind (``FAULTS``): a silent ``partition`` or ``refused`` (the host answers the
backend's connections with resets). Every rank's all_reduce under a 2 s timeout fails within the timeout plus the
fault clauses' slack, and ``get_error()`` then says what the backend declares (``BackendSpec.errors_after_faults``:
``after_timeout`` under the partition, gloo SUCCESS and the reference TIMEOUT; ``after_reset`` under the resets,
gloo SUCCESS and the reference REMOTE_ERROR), and an abort hook registered before runs where the backend has them
(gloo: a strict gap quoting its refusal); the reachable ranks exchange handles over the store and reconfigure
without the cut rank under a fresh uuid: renumbered in order (without a middle rank the ranks after it move down by
one), all_reduce and ``broadcast(group_src=0)`` exact; the controller heals; every rank, the returning one included,
reconfigures to the whole world under another fresh uuid: all_reduce and broadcast exact, each rank numbered as
before. Measured first on gloo under torch 2.14.1 (suites/faults/measure_reconfigure.py, then these clauses).

The scenario runs once per (backend, world size, cut, fault) and every clause reads its own step of it
(suites/faults/recovery.py, recovery_rank.py); a run that raised or hung is not run again for the next clause. A
middle rank needs ranks on both sides: its cases skip below world size 3 (min_world_size). ``--faults`` selects the
faults as for the other fault clauses (suites/faults/conftest.py). Its home is the fault area, not suites/c10d/: its
subject is what a backend does across a network fault, it needs ranks on simulated hosts and a controller that
injects the fault while they run, and suites/c10d/test_reconfigure.py and test_fault_signals.py hold the same API to
its contract on loopback, without a network fault. On a torch without the API every clause is skipped saying which
torch adds it (backends/spec.py TORCH_RELEASE_GAPS); without root or ``ip netns`` saying that.
"""

from __future__ import annotations

import pytest

from fixtures.pytest_plugin import pool_of
from suites.c10d.fault_tolerance import triangle
from suites.faults.recovery import CUTS, DETECT_TIMEOUT_S, FAULTS, Recovery, run_recovery
from suites.faults.recovery_rank import BROADCAST_VALUE
from suites.faults.scenario import SLACK_S
from suites.faults.table import TABLE

pytestmark = [pytest.mark.needs(collective="all_reduce", feature="reconfigure"), pytest.mark.min_world_size(2)]

# one run of the scenario per (cut, fault): every clause reads its own step of each; a cut that needs more ranks than
# the world has is skipped by its world size (a middle rank needs ranks on both sides)
RUNS = [pytest.param(cut.name, fault, id=f"{cut.name}-{fault}", marks=pytest.mark.min_world_size(cut.min_world_size))
        for cut in CUTS.values() for fault in FAULTS]


class Recoveries:
    """One run of the scenario per (backend, world size, cut, fault), each in a world on simulated hosts of its own,
    for every clause to read."""

    def __init__(self, config) -> None:
        self.config = config
        self.runs: dict[tuple[str, int, str, str], Recovery] = {}
        self.failed: dict[tuple[str, int, str, str], str] = {}  # a run that raised or hung: why, in one line

    def get(self, backend_spec, world_size: int, cut: str, fault: str) -> Recovery:
        key = (backend_spec.name, world_size, cut, fault)
        if key in self.failed:  # never run again: a hang costs the whole deadline each time
            pytest.fail(f"the scenario's one run failed (see the first case of it): {self.failed[key]}")
        if key not in self.runs:
            pool = pool_of(self.config)
            reason = pool.cannot_host(backend_spec, world_size, hosts="netns")
            if reason:
                pytest.skip(reason)
            world = pool.private_world(backend_spec.name, world_size, hosts="netns")
            try:
                self.runs[key] = run_recovery(world, fault, cut)
            except BaseException as exc:
                world.kill()  # a rank raised or hung: nothing of it is reused
                self.failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                raise
            world.close()  # one run per world: its hosts go with it
        return self.runs[key]


@pytest.fixture(scope="module")
def recoveries(request) -> Recoveries:
    return Recoveries(request.config)


@pytest.fixture
def recovery(recoveries, backend_spec, world_target, cut, fault) -> Recovery:
    """The one run of the scenario (``cut``'s rank cut off by ``fault``) in this backend's hosted world at this world
    size."""
    return recoveries.get(backend_spec, world_target.world_size, cut, fault)


def _step(recovery: Recovery, name: str, ranks=None) -> dict:
    """Each rank's outcome of step ``name`` (all ranks, or ``ranks``), after checking the controller saw them all."""
    assert not recovery.missing, recovery.missing
    chosen = range(len(recovery.ranks)) if ranks is None else ranks
    return {r: recovery.ranks[r][name] for r in chosen}


def _outcome(call: dict):
    return call["value"] if call["ok"] else f"{call['type']}: {call['error'][:200]}"


def _exact(calls: dict, size: int, numbering) -> dict:
    """The ranks whose (size, rank, all_reduce, broadcast) is not exact, with what they got."""
    return {r: _outcome(c) for r, c in calls.items()
            if not c["ok"] or c["value"] != [size, numbering(r), triangle(size), BROADCAST_VALUE]}


# --------------------------------------------------------------------------- before and under the fault
@pytest.mark.parametrize("cut, fault", RUNS)
def test_every_handle_makes_the_group_before_the_cut(recovery):
    """Before the fault, every rank's handle makes the whole group: all_reduce and broadcast exact."""
    calls = _step(recovery, "first")
    assert not (wrong := _exact(calls, len(calls), lambda r: r)), f"(size, rank, all_reduce, broadcast): {wrong}"


@pytest.mark.parametrize("cut, fault", RUNS)
def test_every_rank_detects_the_cut_within_its_timeout(recovery):
    """Once a rank's host is cut off, every rank's all_reduce raises a RuntimeError within its timeout plus slack."""
    calls = _step(recovery, "under")
    wrong = {r: _outcome(c) if c["ok"] else f"{c['seconds']:.2f} s: {c['error'][:160]}" for r, c in calls.items()
             if c["ok"] or not c["runtime_error"] or c["seconds"] > DETECT_TIMEOUT_S + SLACK_S}
    assert not wrong, f"{recovery.fault} of rank {recovery.cut_rank}: bound {DETECT_TIMEOUT_S + SLACK_S:g} s; " \
                      f"ranks {wrong}"


def _declared_error(backend_spec, fault: str) -> str:
    """What get_error() must say once the fault failed the all_reduce: the backend's ``after_timeout`` where only a
    timeout ends a wait (a partition), its ``after_reset`` where the host answers with resets (table.ENDS_BY)."""
    errors = backend_spec.errors_after_faults
    return errors.after_reset if TABLE[fault].ends_by == "reset" else errors.after_timeout


@pytest.mark.needs(feature="get_error")
@pytest.mark.parametrize("cut, fault", RUNS)
def test_get_error_after_the_cut_is_as_declared(recovery, backend_spec):
    """After the cut every rank's get_error() is what the backend declares for the fault (a timeout or a reset).

    ``errors_after_faults.after_timeout`` under a partition, ``after_reset`` under refused."""
    _step(recovery, "under")
    declared = _declared_error(backend_spec, recovery.fault)
    seen = {r: found["error"] for r, found in enumerate(recovery.ranks)}
    assert set(seen.values()) == {declared}, f"{recovery.fault}: declared {declared}; get_error() by rank {seen}"


@pytest.mark.needs(feature="abort_hooks")
@pytest.mark.parametrize("cut, fault", RUNS)
def test_the_abort_hook_runs_when_the_cut_revokes_the_group(recovery):
    """The abort hook registered before the cut runs on every rank whose all_reduce failed under it."""
    _step(recovery, "under")
    refused = {r: found["hook refused"] for r, found in enumerate(recovery.ranks) if found["hook refused"]}
    assert not refused, f"register_abort_hook: {refused}"
    silent = [r for r, found in enumerate(recovery.ranks) if not found["hook fired"]]
    assert not silent, f"{recovery.fault} of rank {recovery.cut_rank}: ranks {silent}: the abort hook did not run"


# --------------------------------------------------------------------------- shrink, heal, grow back
@pytest.mark.parametrize("cut, fault", RUNS)
def test_the_reachable_ranks_reconfigure_without_the_cut_rank(recovery):
    """Without the cut rank the reachable ranks reconfigure, renumbered in order: all_reduce and broadcast exact.

    Under a fresh uuid; without a middle rank the ranks after it move down by one."""
    calls = _step(recovery, "shrink", recovery.reachable)
    assert not (wrong := _exact(calls, len(recovery.reachable), recovery.shrunk_rank)), \
        f"without rank {recovery.cut_rank}, (size, rank, all_reduce, broadcast) by world rank: {wrong}"


@pytest.mark.parametrize("cut, fault", RUNS)
def test_after_healing_the_whole_world_grows_back_by_reconfigure(recovery):
    """After healing every rank reconfigures to the whole world, numbered as before: all_reduce and broadcast exact.

    The returning rank included, under a fresh uuid."""
    calls = _step(recovery, "grow")
    assert not (wrong := _exact(calls, len(calls), lambda r: r)), f"(size, rank, all_reduce, broadcast): {wrong}"
