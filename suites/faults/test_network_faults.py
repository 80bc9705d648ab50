"""Contract: under a network fault every operation (all_reduce, barrier, p2p, a store get) ends within its timeout plus
a stated slack, with an error that names the operation or the peer, on every rank the fault reaches, and succeeds
exactly on every rank it does not; a reset fails it at once; aborting or destroying a group returns within the same
bound; the reachable ranks can shrink the group; after healing, the group is what the backend declares and a new
group is exact; the first collective of a group whose connections the fault forestalled is bounded too, and so is
ending that group.

Every rank runs on a simulated host of its own (fixtures/hosts: a network namespace, its own address, the store
on the switch); the last rank's host gets the fault from suites/faults/table.py in the middle of a job (its
groups' connections exist), on groups made with a 2 s timeout (scenario.TIMEOUT_S; 20 s under a negative
control). One scenario per fault, backend and world size (suites/faults/scenario.py) runs every operation at once,
each on a group of its own; every clause reads it. Which ranks a fault reaches in an operation follows from the two tables' data
(suites/faults/operations.py ``reached``). Measured first on torch 2.13 with gloo (docs/faults.md). The default
run takes one fault of each kind (a silent partition, a reset, a slow link); ``--faults all`` every fault of the
table (a list of names those), and the first collective under lazy init (a group made under the backend's lazy
connection switch, BackendSpec.lazy_connect_env) with the group's ending after it.
"""

from __future__ import annotations

import re

import pytest

from suites.faults.operations import BY_NAME, OPERATIONS, breaks, reached, unreached
from suites.faults.scenario import SLACK_S, TIMEOUT_S, payloads
from suites.faults.table import FAULTS, TABLE

BOUND_S = TIMEOUT_S + SLACK_S
BREAKING = [f.name for f in FAULTS if f.breaks]
RESETS = [f.name for f in FAULTS if f.ends_by == "reset"]
# (fault, operation) pairs, from the tables' data: those the fault breaks, and those with ranks it does not reach
BROKEN = [(f.name, op.name) for f in FAULTS for op in OPERATIONS if breaks(f, op)]
SPARED = [(f.name, op.name) for f in FAULTS for op in OPERATIONS if unreached(f, op, 2)]
TIMED_OUT = [f.name for f in FAULTS if f.ends_by == "timeout" and breaks(f, BY_NAME["all_reduce"])]
# every fault that breaks the all_reduce from the network (a frozen rank is not one: it never starts its call); the
# issue measured the partition (pytorch/gloo#520). Each run waits up to 12 s on gloo: only when --faults names faults.
FIRST_COLLECTIVE_FAULTS = [f.name for f in FAULTS if breaks(f, BY_NAME["all_reduce"]) and not f.stops_the_rank]
# the faults that cut the p2p while its sender runs (a frozen sender's call lasts as long as its freeze)
ISEND_CUT = [f.name for f in FAULTS if breaks(f, BY_NAME["p2p"]) and not f.stops_the_rank]
# "at once": a call that waited for the connection would take the group's timeout (2 s) to give up
ISEND_RETURN_S = TIMEOUT_S / 4
ENDING_STEPS = ("destroyed", "dropped")  # rank_side.first_collective: destroy_process_group, then the last reference


def _brief(outcome: dict) -> object:
    return outcome["value"] if outcome["ok"] else f"{outcome['type']} after {outcome['seconds']:.2f} s: " \
                                                  f"{outcome['error'][:200]}"


# --------------------------------------------------------------------------- under the fault
@pytest.mark.needs(clause="test_the_operation_ends_within_its_timeout")
@pytest.mark.parametrize("fault, operation", BROKEN)
def test_the_operation_ends_within_its_timeout(scenario, operation):
    """Under the fault every rank's call returns or raises within its timeout plus the stated slack."""
    assert not scenario.missing, scenario.missing
    late = {r: _brief(c) for r, c in scenario.outcomes(operation).items() if c["seconds"] > BOUND_S}
    assert not late, f"{scenario.fault}, {operation}: bound {BOUND_S:g} s; ranks {late}"


@pytest.mark.needs(clause="test_every_rank_gets_a_runtime_error")
@pytest.mark.parametrize("fault, operation", BROKEN)
def test_every_rank_gets_a_runtime_error(scenario, operation):
    """Every rank the fault reaches raises a RuntimeError (torch's DistBackendError and DistStoreError are ones)."""
    calls = scenario.outcomes(operation)
    wrong = {r: _brief(calls[r]) for r in reached(TABLE[scenario.fault], BY_NAME[operation], len(scenario.ranks))
             if calls[r]["ok"] or not calls[r]["runtime_error"]}
    assert not wrong, f"{scenario.fault}, {operation}: {wrong}"


@pytest.mark.needs(clause="test_the_error_names_the_operation_or_the_peer")
@pytest.mark.parametrize("fault, operation", BROKEN)
def test_the_error_names_the_operation_or_the_peer(scenario, operation):
    """Each reached rank's error names the operation or the peer it lost (its rank, its host's address, the store)."""
    cut, op = scenario.cut_rank, BY_NAME[operation]
    names = re.compile(rf"{op.names}|rank\s*\[?{cut}\b|127\.77\.0\.{cut + 1}\b|ranks \[[\d, ]*{cut}", re.I)
    asked = [r for r in reached(TABLE[scenario.fault], op, len(scenario.ranks)) if r != cut or op.waiting == "cut"]
    calls = scenario.outcomes(operation)
    unnamed = {r: _brief(calls[r]) for r in asked if not names.search(calls[r].get("error", ""))}
    assert not unnamed, f"{scenario.fault}: errors naming neither {operation} nor rank {cut}: {unnamed}"


@pytest.mark.needs(clause="test_isend_returns_at_once_under_the_fault")
@pytest.mark.parametrize("fault", ISEND_CUT)
def test_isend_returns_at_once_under_the_fault(scenario):
    """The sender's isend of a payload larger than the connection holds returns its Work (or raises) at once under the
    fault: only its wait() waits for the receiver.

    An isend that writes on the caller's thread until the bytes are in the connection holds its caller for the
    group's timeout when nobody reads them; over an RPC agent's days-long group that caller was an RPC's."""
    call = scenario.ranks[scenario.cut_rank]["isend"]
    assert call["ok"] and call["seconds"] < ISEND_RETURN_S, \
        f"{scenario.fault}: rank {scenario.cut_rank}'s isend of {payloads(TABLE[scenario.fault])['p2p']} float32 to " \
        f"rank 0 {'returned' if call['ok'] else 'had not returned'} after {call['seconds']:.2f} s (at once: within " \
        f"{ISEND_RETURN_S:g} s)"


@pytest.mark.needs(clause="test_a_reset_fails_at_once_on_the_reset_host_and_a_peer")
@pytest.mark.parametrize("fault, operation", [(f, op) for f, op in BROKEN if f in RESETS])
def test_a_reset_fails_at_once_on_the_reset_host_and_a_peer(scenario, operation):
    """A reset ends the call before its timeout on the host that resets and, in a collective, on a peer too.

    A rank with no connection to that host in the operation (gloo's ring at 3 ranks), or one that only reads from
    it (a p2p receiver that sends nothing), learns of it only through its own timeout: torch's backends do not tell
    the rest of a group that one member failed."""
    calls = scenario.outcomes(operation)
    at_once = [r for r, c in calls.items() if c["seconds"] < TIMEOUT_S]
    wanted = 2 if BY_NAME[operation].waiting == "every" else 1
    assert scenario.cut_rank in at_once and len(at_once) >= wanted, \
        f"seconds by rank {({r: round(c['seconds'], 2) for r, c in calls.items()})}: a reset must end the call at " \
        f"once on rank {scenario.cut_rank}" + (" and a peer" if wanted == 2 else "")


@pytest.mark.parametrize("fault, operation", SPARED)
def test_what_the_fault_does_not_reach_succeeds_exactly(scenario, operation):
    """Every rank the fault does not reach (all of them on a slow or lossy link) succeeds, exact, within its timeout."""
    size, cut = len(scenario.ranks), scenario.cut_rank
    want = {"all_reduce": lambda r: float(size), "barrier": lambda r: True, "p2p": lambda r: float(cut + 1),
            "store_get": lambda r: f"rank {r}"}[operation]
    calls = scenario.outcomes(operation)
    wrong = {r: _brief(calls[r]) for r in unreached(TABLE[scenario.fault], BY_NAME[operation], size)
             if not (calls[r]["ok"] and calls[r]["value"] == want(r))}
    assert not wrong, f"{scenario.fault}, {operation}: {wrong}"


# --------------------------------------------------------------------------- ending a group under the fault
@pytest.mark.parametrize("fault", BREAKING)
def test_abort_returns_within_the_bound(scenario):
    """Aborting a group (_abort_process_group) while an all_reduce waits on it under the fault returns within the
    group's timeout plus the slack, on every rank."""
    wrong = {r: _brief(c) for r, c in scenario.outcomes("abort").items() if not c["ok"] or c["seconds"] > BOUND_S}
    assert not wrong, f"{scenario.fault}: bound {BOUND_S:g} s; ranks {wrong}"


@pytest.mark.parametrize("fault", BREAKING)
def test_destroy_returns_within_the_bound(scenario):
    """destroy_process_group(group) while an all_reduce waits on it under the fault returns within the group's
    timeout plus the slack, on every rank."""
    wrong = {r: _brief(c) for r, c in scenario.outcomes("destroy").items() if not c["ok"] or c["seconds"] > BOUND_S}
    assert not wrong, f"{scenario.fault}: bound {BOUND_S:g} s; ranks {wrong}"


@pytest.mark.needs(feature="shrinking")
@pytest.mark.parametrize("fault", BREAKING)
def test_the_reachable_ranks_shrink_the_group(scenario):
    """Under the fault the reachable ranks shrink_group the cut-off rank away and all_reduce on the rest, exact."""
    kept = len(scenario.ranks) - 1
    wrong = {r: _brief(c) for r, c in scenario.outcomes("shrink").items()
             if not (c["ok"] and c["value"] == float(kept))}
    assert not wrong, f"{scenario.fault}: ranks {wrong}"


# --------------------------------------------------------------------------- after healing
@pytest.mark.parametrize("fault", TIMED_OUT)
def test_after_healing_the_group_is_as_declared(scenario, backend_spec):
    """After healing, the group whose all_reduce timed out is what the backend declares (after_timeout): usable and
    exact, or every call raising at once with the declared error."""
    declared = backend_spec.after_timeout
    calls = scenario.outcomes("after")
    if declared is None:
        assert len({c["ok"] for c in calls.values()}) == 1, "undeclared: every rank must get the same outcome"
    elif declared.usable:
        assert all(c["ok"] and c["value"] == len(calls) for c in calls.values()), calls
    else:
        # the declared error is matched against "Type: text", as suites/c10d/test_timeouts.py does
        wrong = {r: _brief(c) for r, c in calls.items() if c["ok"] or c["seconds"] > TIMEOUT_S / 2
                 or not re.search(declared.error, f"{c.get('type')}: {c.get('error', '')}")}
        assert not wrong, f"declared dead ({declared.error!r}); ranks {wrong}"


@pytest.mark.parametrize("fault", [f.name for f in FAULTS])
def test_a_new_group_after_healing_is_exact(scenario):
    """After healing, a group made anew over the same hosts works: all_reduce is exact on every rank."""
    calls = scenario.outcomes("renewed")
    wrong = {r: _brief(c) for r, c in calls.items() if not (c["ok"] and c["value"] == len(calls))}
    assert not wrong, wrong


# --------------------------------------------------------------------------- before the first connection
@pytest.mark.needs(clause="test_the_first_collective_ends_within_its_timeout")
@pytest.mark.fault_matrix
@pytest.mark.parametrize("fault", FIRST_COLLECTIVE_FAULTS)
def test_the_first_collective_ends_within_its_timeout(first_connect_scenario):
    """With the fault in place before a group's first connection (gloo: TORCH_GLOO_LAZY_INIT=1), its first all_reduce
    raises a RuntimeError within the group's timeout plus the slack on every rank."""
    scenario = first_connect_scenario
    wrong = {r: _brief(c) for r, c in scenario.outcomes("all_reduce").items()
             if c["ok"] or not c["runtime_error"] or c["seconds"] > BOUND_S}
    assert not wrong, f"{scenario.fault} before the first connection: bound {BOUND_S:g} s; ranks {wrong}"


@pytest.mark.needs(clause="test_the_group_ends_after_its_first_collective_failed")
@pytest.mark.fault_matrix
@pytest.mark.parametrize("fault", FIRST_COLLECTIVE_FAULTS)
def test_the_group_ends_after_its_first_collective_failed(first_connect_scenario):
    """Once its first all_reduce under the fault has returned, the group ends within the bound on every such rank:
    destroy_process_group(group), then dropping its last reference (the backend's destructor)."""
    scenario = first_connect_scenario
    judged = {r: rank for r, rank in enumerate(scenario.ranks) if not rank["all_reduce"].get("stuck")}
    assert judged, f"{scenario.fault}: no rank's first all_reduce returned, so no group was ended (the clause above)"
    wrong = {(r, step): _brief(rank[step]) if step in rank else "not reached (the step before never returned)"
             for r, rank in judged.items() for step in ENDING_STEPS
             if step not in rank or rank[step].get("stuck") or rank[step]["seconds"] > BOUND_S}
    assert not wrong, f"{scenario.fault} before the first connection: bound {BOUND_S:g} s; (rank, step) {wrong}"
