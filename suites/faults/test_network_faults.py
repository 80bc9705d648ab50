"""Contract: a collective under a network fault ends within its timeout plus a stated slack, with an error that
names the operation or the peer; a reset fails it at once; a slow or lossy link never breaks one that fits its
timeout; after healing, the group is what the backend declares and a new group is exact.

Every rank runs on a simulated host of its own (fixtures/hosts: a network namespace, its own address, the store
on the switch); the last rank's host gets the fault from suites/faults/table.py in the middle of a job (its
group's connections exist), on a group made with a 2 s timeout (scenario.TIMEOUT_S). One scenario per fault,
backend and world size (suites/faults/scenario.py); every clause reads it. Measured first on torch 2.13 with
gloo and TensorPipe (docs/faults.md). The default run takes one fault of each kind (a silent partition, a reset,
a slow link); ``--faults all`` the table's breaking and negative-control faults.
"""

from __future__ import annotations

import re

import pytest

from suites.faults.scenario import SLACK_S, TIMEOUT_S
from suites.faults.table import TABLE

DEFAULT_FAULTS = ("partition", "refused", "slow")  # one of each kind: silence, reset, negative control
BREAKING = [name for name in DEFAULT_FAULTS if TABLE[name].breaks]
TIMING_OUT = [name for name in BREAKING if name != "refused"]  # frames vanish: only the timeout ends the wait


def _ranks(scenario, phase):
    return [(rank, out[phase]) for rank, out in enumerate(scenario.ranks)]


# --------------------------------------------------------------------------- under the fault
@pytest.mark.parametrize("fault", BREAKING)
def test_the_collective_ends_within_its_timeout(scenario):
    """Under the fault every rank's all_reduce returns or raises within the group's timeout plus the stated slack."""
    assert not scenario.missing, scenario.missing
    slow = {r: round(c["seconds"], 2) for r, c in _ranks(scenario, "under") if c["seconds"] > TIMEOUT_S + SLACK_S}
    assert not slow, f"{scenario.fault}: ranks took {slow} s; bound {TIMEOUT_S + SLACK_S:g} s"


@pytest.mark.parametrize("fault", BREAKING)
def test_every_rank_gets_a_runtime_error(scenario):
    """Under the fault every rank's all_reduce raises a RuntimeError (torch's DistBackendError is one), none succeeds."""
    calls = _ranks(scenario, "under")
    assert all(not c["ok"] and c["runtime_error"] for _, c in calls), \
        {r: c.get("type", "returned") for r, c in calls}


@pytest.mark.needs(clause="test_the_error_names_the_operation_or_the_peer")
@pytest.mark.parametrize("fault", BREAKING)
def test_the_error_names_the_operation_or_the_peer(scenario):
    """Each rank's error names the operation (all_reduce) or the peer it lost (its rank or its host's address)."""
    cut = scenario.cut_rank
    peer = re.compile(rf"all_?reduce|rank\s*\[?{cut}\b|127\.77\.0\.{cut + 1}\b|ranks \[[\d, ]*{cut}", re.I)
    unnamed = {r: c.get("error", "")[:200] for r, c in _ranks(scenario, "under")
               if r != cut and not peer.search(c.get("error", ""))}
    assert not unnamed, f"{scenario.fault}: errors naming neither all_reduce nor rank {cut}: {unnamed}"


@pytest.mark.parametrize("fault", ["refused"])
def test_a_reset_fails_at_once_on_the_reset_host_and_a_peer(scenario):
    """A reset fails the collective before its timeout on the host that resets and on at least one peer.

    A rank with no connection to that host in the collective (gloo's ring at 3 ranks) learns of it only through
    its own timeout: torch's backends do not tell the rest of a group that one member failed."""
    seconds = {r: round(c["seconds"], 2) for r, c in _ranks(scenario, "under")}
    at_once = [r for r, s in seconds.items() if s < TIMEOUT_S]
    assert scenario.cut_rank in at_once and len(at_once) >= 2, \
        f"seconds by rank {seconds}: a reset must end the call at once on rank {scenario.cut_rank} and a peer"


@pytest.mark.parametrize("fault", [name for name in DEFAULT_FAULTS if not TABLE[name].breaks])
def test_a_slow_link_never_breaks_a_collective_that_fits_its_timeout(scenario):
    """The negative control: on a slow link an all_reduce that fits its timeout succeeds, exact, on every rank."""
    calls = _ranks(scenario, "under")
    size = len(calls)
    assert all(c["ok"] and c["value"] == size for _, c in calls), \
        {r: c.get("value", c.get("error", ""))[:200] if not c["ok"] else c["value"] for r, c in calls}


# --------------------------------------------------------------------------- after healing
@pytest.mark.parametrize("fault", TIMING_OUT)
def test_after_healing_the_group_is_as_declared(scenario, backend_spec):
    """After healing, the group that timed out is what the backend declares (after_timeout): usable and exact, or
    every call raising at once with the declared error."""
    declared = backend_spec.after_timeout
    calls = _ranks(scenario, "after")
    if declared is None:
        assert len({c["ok"] for _, c in calls}) == 1, "undeclared: every rank must get the same outcome"
    elif declared.usable:
        assert all(c["ok"] and c["value"] == len(calls) for _, c in calls), calls
    else:
        # the declared error is matched against "Type: text", as suites/c10d/test_timeouts.py does
        wrong = {r: (round(c["seconds"], 2), c.get("error", "")[:160]) for r, c in calls
                 if c["ok"] or c["seconds"] > TIMEOUT_S / 2
                 or not re.search(declared.error, f"{c.get('type')}: {c.get('error', '')}")}
        assert not wrong, f"declared dead ({declared.error!r}); ranks {wrong}"


@pytest.mark.parametrize("fault", list(DEFAULT_FAULTS))
def test_a_new_group_after_healing_is_exact(scenario):
    """After healing, a group made anew over the same hosts works: all_reduce is exact on every rank."""
    calls = _ranks(scenario, "renewed")
    assert all(c["ok"] and c["value"] == len(calls) for _, c in calls), \
        {r: c.get("error", "")[:200] for r, c in calls if not c["ok"]}
