"""Contract: after a partition cuts one rank's host off mid-job, the others detect it within their timeout, reconfigure
without it and continue exactly; once healed, the whole world comes back by reconfigure, exact again (torch 2.14).

Issue 36's end-to-end scenario, on torch 2.14's fault-tolerance API (docs/fault-tolerance.md) and the fault area's
simulated hosts (docs/faults.md): a private world with every rank on a host of its own, the store on the switch.
Every rank remakes the default group with ``enable_reconfigure=True`` and reconfigures it with every handle; the
controller partitions the last rank's host (the table's ``partition``); every rank's all_reduce under a 2 s
timeout fails within the timeout plus the fault clauses' slack, and ``get_error()`` then says what the backend
declares (``BackendSpec.errors_after_faults.after_timeout``: gloo SUCCESS, the reference TIMEOUT), and an abort
hook registered before runs where the backend has them (gloo: a strict gap quoting its refusal); the reachable
ranks exchange handles over the store and reconfigure without the cut rank under a fresh uuid: renumbered,
all_reduce and ``broadcast(group_src=0)`` exact; the controller heals; every rank, the returning one included,
reconfigures to the whole world under another fresh uuid: all_reduce and broadcast exact, each rank numbered as
before. Measured first on gloo under torch 2.14.1 (suites/faults/measure_reconfigure.py).

The scenario runs once per (backend, world size) and every clause reads its own step of it
(suites/faults/recovery.py, recovery_rank.py). Its home is the fault area, not suites/c10d/: its subject is what a
backend does across a network fault, it needs ranks on simulated hosts and a controller that injects the fault
while they run, and suites/c10d/test_reconfigure.py and test_fault_signals.py hold the same API to its contract
on loopback, without a network fault. On a torch without the API every clause is skipped saying which torch adds
it (backends/spec.py TORCH_RELEASE_GAPS); without root or ``ip netns`` saying that.
"""

from __future__ import annotations

import pytest

from fixtures.pytest_plugin import pool_of
from suites.c10d.fault_tolerance import triangle
from suites.faults.recovery import DETECT_TIMEOUT_S, Recovery, run_recovery
from suites.faults.recovery_rank import BROADCAST_VALUE
from suites.faults.scenario import SLACK_S

pytestmark = [pytest.mark.needs(collective="all_reduce", feature="reconfigure"), pytest.mark.min_world_size(2)]


class Recoveries:
    """One run of the scenario per (backend, world size), each in a world on simulated hosts of its own, for every
    clause to read."""

    def __init__(self, config) -> None:
        self.config = config
        self.runs: dict[tuple[str, int], Recovery] = {}

    def get(self, backend_spec, world_size: int) -> Recovery:
        key = (backend_spec.name, world_size)
        if key not in self.runs:
            pool = pool_of(self.config)
            reason = pool.cannot_host(backend_spec, world_size, hosts="netns")
            if reason:
                pytest.skip(reason)
            world = pool.private_world(backend_spec.name, world_size, hosts="netns")
            try:
                self.runs[key] = run_recovery(world)
            except BaseException:
                world.kill()  # a rank raised or hung: nothing of it is reused
                raise
            world.close()  # one run per world: its hosts go with it
        return self.runs[key]


@pytest.fixture(scope="module")
def recoveries(request) -> Recoveries:
    return Recoveries(request.config)


@pytest.fixture
def recovery(recoveries, backend_spec, world_target) -> Recovery:
    """The one run of the scenario in this backend's hosted world at this world size."""
    return recoveries.get(backend_spec, world_target.world_size)


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


# --------------------------------------------------------------------------- before and under the partition
def test_every_handle_makes_the_group_before_the_partition(recovery):
    """Before the partition, every rank's handle makes the whole group: all_reduce and broadcast exact."""
    calls = _step(recovery, "first")
    assert not (wrong := _exact(calls, len(calls), lambda r: r)), f"(size, rank, all_reduce, broadcast): {wrong}"


def test_every_rank_detects_the_partition_within_its_timeout(recovery):
    """Under the partition every rank's all_reduce raises a RuntimeError within its timeout plus the stated slack."""
    calls = _step(recovery, "under")
    wrong = {r: _outcome(c) if c["ok"] else f"{c['seconds']:.2f} s: {c['error'][:160]}" for r, c in calls.items()
             if c["ok"] or not c["runtime_error"] or c["seconds"] > DETECT_TIMEOUT_S + SLACK_S}
    assert not wrong, f"bound {DETECT_TIMEOUT_S + SLACK_S:g} s; ranks {wrong}"


@pytest.mark.needs(feature="get_error")
def test_get_error_after_the_partition_is_as_declared(recovery, backend_spec):
    """After the partition's timeout every rank's get_error() is what the backend declares after a timeout."""
    _step(recovery, "under")
    declared = backend_spec.errors_after_faults.after_timeout
    seen = {r: found["error"] for r, found in enumerate(recovery.ranks)}
    assert set(seen.values()) == {declared}, f"declared {declared}; get_error() by rank {seen}"


@pytest.mark.needs(feature="abort_hooks")
def test_the_abort_hook_runs_when_the_partition_revokes_the_group(recovery):
    """The abort hook registered before the partition runs on every rank whose all_reduce timed out under it."""
    _step(recovery, "under")
    refused = {r: found["hook refused"] for r, found in enumerate(recovery.ranks) if found["hook refused"]}
    assert not refused, f"register_abort_hook: {refused}"
    silent = [r for r, found in enumerate(recovery.ranks) if not found["hook fired"]]
    assert not silent, f"ranks {silent}: the abort hook did not run"


# --------------------------------------------------------------------------- shrink, heal, grow back
def test_the_reachable_ranks_reconfigure_without_the_cut_rank(recovery):
    """The reachable ranks reconfigure without the cut rank under a fresh uuid: renumbered, all_reduce and broadcast
    exact."""
    reachable = range(recovery.cut_rank)
    calls = _step(recovery, "shrink", reachable)
    assert not (wrong := _exact(calls, len(reachable), lambda r: r)), \
        f"without rank {recovery.cut_rank}, (size, rank, all_reduce, broadcast): {wrong}"


def test_after_healing_the_whole_world_grows_back_by_reconfigure(recovery):
    """After healing every rank, the returning one included, reconfigures to the whole world under a fresh uuid:
    each numbered as before, all_reduce and broadcast exact."""
    calls = _step(recovery, "grow")
    assert not (wrong := _exact(calls, len(calls), lambda r: r)), f"(size, rank, all_reduce, broadcast): {wrong}"
