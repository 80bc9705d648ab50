"""Contract: an RPC agent's calls under a network fault end within their timeout plus a stated slack, raising a
RuntimeError that names the call or the peer; graceful shutdown ends within the timeout it was given and connecting
within the agent's RPC timeout; a slow or lossy link never breaks a call that fits its timeout; after healing, the
agent is what its spec declares (``AgentSpec.after_faults``).

Every rank runs on a simulated host of its own (fixtures/hosts), the last rank's host gets the fault from
suites/faults/table.py, and each rank calls across the cut (the cut rank's peers call it, it calls rank 0) with an
RPC timeout of 2 s (scenario.TIMEOUT_S; 20 s under a negative control, whose calls must fit it, as the
collectives'). One scenario per (backend, world size, agent, fault, kind)
(suites/faults/rpc_scenario.py): ``calls`` (rpc_sync, rpc_async, remote and to_here in flight together under the
fault, then each again after healing), ``shutdown`` (a call in flight across the cut, then
``shutdown(graceful=True, timeout=2)``) and ``connect`` (the fault in place before ``init_rpc``). Measured first on
torch 2.13 with TensorPipe (docs/faults.md); where torch has no bound the clause still holds the agent to its
timeout and TensorPipe's behaviour is a gap quoting it (backends/rpc_agents.py). The default run takes a silent
partition and a slow link; ``--faults all`` adds resets (refused connections, and each connection cut after 256 KiB
in the middle of a 1 MiB call), a lossy link and the other silent faults (one direction, a link down, a frozen
process, the agent's connections alone) and the store alone cut off (``control_plane``: there the agents rendezvous
at the world's store on the switch, elsewhere through a file so that only their own connections cross the faulty
link), ``--faults NAMES`` those named. A frozen rank makes its calls once it is let go, the fault healed: under it,
only its peers' calls are read.
"""

# ruff: noqa: F811  (the clauses take the fixtures imported from rpc_worlds as arguments of the same names)
from __future__ import annotations

import re

import pytest

from suites.faults import figures
from suites.faults.scenario import SLACK_S, TIMEOUT_S  # the RPC timeout under a breaking fault, and its slack
from suites.faults.rpc_worlds import hosted_agents, rpc_agent  # noqa: F401  (fixtures of these clauses)
from suites.faults.table import TABLE

SILENT = "partition"  # frames vanish: only the timeout ends a wait
RESET = "refused"  # the peer's host resets the agent's connections
CUT = "cut_after_bytes"  # each of the agent's connections reset in the middle of a 1 MiB call
SLOW = "slow"  # the negative controls: a rate-limited link, and one losing 10 % of its segments at random
LOSSY = "lossy"
DEFAULT_FAULTS = (SILENT, SLOW)  # the default run's: a partition and a slow link (a reset only with --faults)
# silent too, each in its own way: the cut host's sends dropped (one direction), its link down, its process stopped
# (SIGSTOP), only the agent's own connections dropped (the store's pass)
OTHER_SILENT = ("one_way", "flap", "frozen", "data_plane")
# the store alone cut off (its port's traffic dropped): under it the agents rendezvous at the world's store
# (rpc_scenario.py), so it reaches their start and whatever else of theirs goes through the store
CONTROL = "control_plane"
BOUND_S = TIMEOUT_S + SLACK_S
# the operation (rpc_sync, rpc_async, remote, to_here, an RRef fetch) or the peer (worker<N>, rank <N>, id=<N>)
NAMES_A_CALL = r"rpc_sync|rpc_async|remote\(|rpc\.remote|to_here|RRef"


def pytest_generate_tests(metafunc):
    """``fault``: the default run's (a partition, a slow link), or, once ``--faults`` names any (``all`` or a list,
    as for the collectives: suites/faults/conftest.py deselects the faults a list leaves out), every fault the clause
    reads."""
    if "fault" not in metafunc.fixturenames:
        return
    wanted = FAULTS_OF[metafunc.function.__name__]
    everything = str(metafunc.config.getoption("faults", default="default") or "default") != "default"
    metafunc.parametrize("fault", [f for f in wanted if everything or f in DEFAULT_FAULTS])


# the faults each clause reads, before the default run's selection
UNDER_A_FAULT = (SILENT, RESET, CUT, *OTHER_SILENT)
FAULTS_OF = {
    "test_every_call_ends_within_its_timeout": UNDER_A_FAULT,
    "test_every_call_raises_a_runtime_error": UNDER_A_FAULT,
    "test_the_error_names_the_call_or_the_peer": UNDER_A_FAULT,
    "test_a_slow_or_lossy_link_never_breaks_a_call_that_fits_its_timeout": (SLOW, LOSSY),
    "test_a_store_cut_off_never_breaks_a_call_between_started_agents": (CONTROL,),
    "test_after_healing_the_agent_is_as_declared": UNDER_A_FAULT,
    "test_graceful_shutdown_ends_within_its_timeout": (SILENT, *OTHER_SILENT, CONTROL),
    "test_connecting_ends_within_the_agent_timeout": (SILENT, *OTHER_SILENT, CONTROL),
}


def _calls(scenario, phase):
    """(rank, operation, outcome) of every call in ``phase``; under the fault, not those of a stopped rank (frozen):
    it made them once it was let go, the fault healed."""
    return [(rank, op, outcome) for rank, out in enumerate(scenario.ranks) for op, outcome in out[phase].items()
            if not (phase == "under" and rank in scenario.stopped)]


def _peer_named(rank: int, cut: int) -> re.Pattern:
    peer = 0 if rank == cut else cut
    return re.compile(rf"{NAMES_A_CALL}|worker{peer}\b|rank {peer}\b|id={peer}\b|127\.77\.0\.{peer + 1}\b")


@pytest.fixture
def calls(request, hosted_agents, backend_spec, world_target, rpc_agent, fault):
    found = hosted_agents.scenario(backend_spec, world_target.world_size, rpc_agent.name, fault, "calls")
    figures.record(request, figures.rpc_figures(found, found.timeout_s, backend_spec.name))
    return found


# --------------------------------------------------------------------------- under the fault
@pytest.mark.needs(clause="test_every_call_ends_within_its_timeout")
def test_every_call_ends_within_its_timeout(calls):
    """Under the fault rpc_sync, rpc_async, remote and to_here return or raise within the RPC timeout plus the slack."""
    assert not calls.missing, calls.missing
    slow = {(r, op): round(c["seconds"], 2) for r, op, c in _calls(calls, "under")
            if not c.get("returned", True) or c["seconds"] > BOUND_S}
    assert not slow, f"{calls.fault}: (rank, call) took {slow} s; bound {BOUND_S:g} s"


@pytest.mark.needs(clause="test_every_call_raises_a_runtime_error")
def test_every_call_raises_a_runtime_error(calls):
    """Under the fault every call across the cut raises a RuntimeError (torch raises RuntimeError), none succeeds."""
    wrong = {(r, op): c.get("type", "returned") for r, op, c in _calls(calls, "under")
             if c["ok"] or not c.get("runtime_error")}
    assert not wrong, f"{calls.fault}: {wrong}"


@pytest.mark.needs(clause="test_the_error_names_the_call_or_the_peer")
def test_the_error_names_the_call_or_the_peer(calls):
    """Each call's error names the call (rpc_sync, rpc_async, remote, to_here) or the peer it lost."""
    unnamed = {(r, op): c.get("error", "")[:160] for r, op, c in _calls(calls, "under")
               if not c["ok"] and not _peer_named(r, calls.cut_rank).search(c.get("error", ""))}
    assert not unnamed, f"{calls.fault}: errors naming neither the call nor the peer: {unnamed}"


def test_a_slow_or_lossy_link_never_breaks_a_call_that_fits_its_timeout(calls):
    """The negative controls: on a slow or lossy link every call that fits its timeout succeeds, exact, on every
    rank."""
    broken = {(r, op): c.get("value", c.get("error", "")[:160]) for r, op, c in _calls(calls, "under")
              if not (c["ok"] and c["value"] == 2.0)}
    assert not broken, f"{calls.fault}: {broken}"


@pytest.mark.needs(clause="test_a_store_cut_off_never_breaks_a_call_between_started_agents")
def test_a_store_cut_off_never_breaks_a_call_between_started_agents(calls):
    """With only the store cut off (where the agents met), every call between agents already started succeeds,
    exact, within its timeout plus the slack, under the fault and after it."""
    broken = {(phase, r, op): c.get("value", c.get("error", "")[:160]) if c.get("returned", True)
              else f"still running after {c['seconds']:.1f} s"
              for phase in ("under", "after") for r, op, c in _calls(calls, phase)
              if not (c["ok"] and c["value"] == 2.0 and c["seconds"] <= BOUND_S)}
    assert not broken, f"{calls.fault}: (phase, rank, call): {broken}"


# --------------------------------------------------------------------------- after healing
@pytest.mark.needs(clause="test_after_healing_the_agent_is_as_declared")
def test_after_healing_the_agent_is_as_declared(calls, rpc_agent):
    """After healing the same agent is what its spec declares: calls exact again, or each raising at once (dead)."""
    declared, after = rpc_agent.after_faults, _calls(calls, "after")
    if declared is None:
        assert len({c["ok"] for _, _, c in after}) == 1, "undeclared: every call must get the same outcome"
        return
    reset = TABLE[calls.fault].ends_by == "reset"  # refused, cut_after_bytes: the agent's connections were reset
    dead = declared.reset_error if reset else ""
    if not dead:
        assert declared.silent_loss_recovers or reset, "declared: silent loss kills the agent"
        wrong = {(r, op): c.get("error", c.get("value")) for r, op, c in after if not (c["ok"] and c["value"] == 2.0)}
        assert not wrong, f"declared recovered after {calls.fault}; (rank, call): {wrong}"
    else:
        wrong = {(r, op): (round(c["seconds"], 2), c.get("error", "")[:160]) for r, op, c in after
                 if c["ok"] or c["seconds"] > TIMEOUT_S / 2
                 or not re.search(dead, f"{c.get('type')}: {c.get('error', '')}")}
        assert not wrong, f"declared dead after {calls.fault} ({dead!r}); (rank, call): {wrong}"


# --------------------------------------------------------------------------- shutdown and connecting
@pytest.mark.needs(clause="test_graceful_shutdown_ends_within_its_timeout")
def test_graceful_shutdown_ends_within_its_timeout(request, hosted_agents, backend_spec, world_target, rpc_agent,
                                                   fault):
    """Under the fault, with a call in flight across it, shutdown(graceful=True, timeout=2) ends within 2 s + slack."""
    got = hosted_agents.scenario(backend_spec, world_target.world_size, rpc_agent.name, fault, "shutdown")
    figures.record(request, figures.rpc_figures(got, got.timeout_s, backend_spec.name))
    late = {r: round(out["seconds"], 2) for r, out in enumerate(got.ranks)
            if not out["returned"] or out["seconds"] > BOUND_S}
    assert not late, f"{fault}: shutdown took {late} s by rank (bound {BOUND_S:g} s; at the bound: never returned)"


@pytest.mark.needs(clause="test_connecting_ends_within_the_agent_timeout")
def test_connecting_ends_within_the_agent_timeout(request, hosted_agents, backend_spec, world_target, rpc_agent,
                                                  fault):
    """With the fault in place before the agent starts, init_rpc and the first call across the cut each end within
    the agent's RPC timeout plus the slack."""
    got = hosted_agents.scenario(backend_spec, world_target.world_size, rpc_agent.name, fault, "connect")
    figures.record(request, figures.rpc_figures(got, got.timeout_s, backend_spec.name))
    late = {(r, step): round(out[step]["seconds"], 2) for r, out in enumerate(got.ranks)
            for step in ("start", "first_call") if out[step] is not None
            and (not out[step]["returned"] or out[step]["seconds"] > BOUND_S)}
    assert not late, f"{fault}: (rank, step) took {late} s (bound {BOUND_S:g} s; at the bound: never returned)"
