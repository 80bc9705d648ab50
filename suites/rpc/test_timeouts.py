"""Contract: an RPC that takes longer than its timeout fails with the agent's timeout error, in time.

A per-call ``timeout=`` bounds rpc_sync, rpc_async, remote (the request) and
``to_here`` (the value); without one the
agent's default (``rpc_timeout``, reported by ``get_rpc_timeout()``) applies;
``timeout=0`` means no timeout at all. The clock covers the whole call: a
request held back in transit (fault injection delays the message) and a
callee that computes too long both time out. The error matches the agent's
own timeout text (``AgentSpec.timeout_error``, e.g. "RPC ran for more than"
for TensorPipe) and arrives no earlier than the timeout and within
``SLACK_S`` after it. A call that finishes within its timeout is unaffected.
"""

import re

import pytest
import torch

from backends.rpc_agents import Faults
from fixtures import rpc_lifecycle as lifecycle
from suites.rpc import udfs
from suites.rpc.call_modes import CALLS, FUNCTION_CALLS, REMOTE, RPC_SYNC
from suites.rpc.common import outcome_of, peer_name
from fixtures.rank import ctx

pytestmark = pytest.mark.waits  # every clause waits on a timeout or a delayed message

TIMEOUT_S = 0.4
DELAY_S = 0.9  # how long fault injection holds back a delayed request
SLACK_S = 2.0  # generous: two cores are shared by many processes
# builtin operators travel as SCRIPT_CALL / SCRIPT_REMOTE_CALL; the agents' own
# control messages (shutdown handshake, RRef bookkeeping) do not
DELAYED = ("SCRIPT_CALL", "SCRIPT_REMOTE_CALL")


def timed_call(rpc, rpc_call, func, args, **timeout):
    """The outcome of calling ``func`` on the peer the way ``rpc_call`` says, ``timeout=`` on the call."""
    return outcome_of(CALLS[rpc_call].invoke, rpc, peer_name(), func, args, **timeout)


def timed_to_here(rpc, func, args, **timeout):
    """The outcome of remote() without a timeout, then to_here with ``timeout=``: to_here's own timeout bounds
    the wait for the value of a remote() already made."""
    return outcome_of(lambda: REMOTE.call(rpc, peer_name(), func, args).to_here(**timeout))


def slow_callee_id(rpc_call: str) -> str:
    """The slow-callee clause's case id: remote's timeout is to_here's there."""
    return "to_here" if CALLS[rpc_call] is REMOTE else rpc_call


def delayed_faults():
    return Faults(delay={kind: DELAY_S for kind in DELAYED})


# ---------------------------------------------------------------- rank side
def slow_callee(rpc_call):
    """On the shared agent: the callee sleeps longer than the call's timeout (remote's: to_here's)."""
    rpc, args = lifecycle.rpc(), (DELAY_S, ctx.rank)
    if CALLS[rpc_call] is REMOTE:
        return timed_to_here(rpc, udfs.sleep_then, args, timeout=TIMEOUT_S)
    return timed_call(rpc, rpc_call, udfs.sleep_then, args, timeout=TIMEOUT_S)


def delayed_with_call_timeout(rpc_call):
    with lifecycle.private_agent(faults=delayed_faults()) as rpc:
        late = timed_call(rpc, rpc_call, torch.add, (torch.ones(2), ctx.rank), timeout=TIMEOUT_S)
        in_time = timed_call(rpc, rpc_call, torch.add, (torch.ones(2), ctx.rank), timeout=DELAY_S + SLACK_S + 5)
    return late, in_time


def delayed_with_default_timeout():
    with lifecycle.private_agent(faults=delayed_faults(), rpc_timeout=TIMEOUT_S) as rpc:
        reported = rpc.get_rpc_timeout()
        late = timed_call(rpc, RPC_SYNC.name, torch.add, (torch.ones(2), ctx.rank))
    return reported, late


def delayed_with_no_timeout():
    with lifecycle.private_agent(faults=delayed_faults(), rpc_timeout=TIMEOUT_S) as rpc:
        return timed_call(rpc, RPC_SYNC.name, torch.add, (torch.ones(2), ctx.rank), timeout=0)


# ---------------------------------------------------------------- checks
def expect_timeout(spec, got, timeout, what, record_property):
    record_property("finding", f"{what}: {got.describe()[:200]} after {got.seconds:.2f} s")
    assert got.raised, f"{what}: {got.describe()} after {got.seconds:.2f} s; expected a timeout after {timeout} s"
    assert re.search(spec.timeout_error, got.error), \
        f"{what}: error {got.error!r} does not match the {spec.name} timeout text {spec.timeout_error!r}"
    assert timeout - 0.05 <= got.seconds <= timeout + SLACK_S, \
        f"{what}: timed out after {got.seconds:.2f} s, expected within [{timeout}, {timeout + SLACK_S}] s"


# ---------------------------------------------------------------- clauses
@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS, ids=slow_callee_id)
def test_slow_callee_times_out(rpc_agent, rpc_call, record_property):
    """A call (or to_here) whose callee computes longer than timeout= fails with the agent's timeout error within [timeout, timeout + slack]."""
    for rank, got in enumerate(rpc_agent.run(slow_callee, rpc_call)):
        expect_timeout(rpc_agent.spec, got, TIMEOUT_S, f"rank {rank} {slow_callee_id(rpc_call)}", record_property)


@pytest.mark.rpc_private_agent
@pytest.mark.needs(rpc_feature="fault_injection")
@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_delayed_message_against_call_timeout(rpc_agent, rpc_call, record_property):
    """A request held in transit longer than timeout= fails with the timeout error in time; with a longer timeout it succeeds."""
    for rank, (late, in_time) in enumerate(rpc_agent.run(delayed_with_call_timeout, rpc_call)):
        expect_timeout(rpc_agent.spec, late, TIMEOUT_S, f"rank {rank} {rpc_call}", record_property)
        assert not in_time.raised and torch.equal(in_time.value, torch.ones(2) + rank), \
            f"rank {rank} {rpc_call} with a long enough timeout: {in_time.describe()}"


@pytest.mark.rpc_private_agent
@pytest.mark.needs(rpc_feature="fault_injection")
def test_default_timeout_applies(rpc_agent, record_property):
    """Without timeout= the agent's rpc_timeout applies (get_rpc_timeout() reports it) and a delayed request times out."""
    for rank, (reported, late) in enumerate(rpc_agent.run(delayed_with_default_timeout)):
        assert reported == pytest.approx(TIMEOUT_S), f"rank {rank}: get_rpc_timeout() = {reported}, configured {TIMEOUT_S}"
        expect_timeout(rpc_agent.spec, late, TIMEOUT_S, f"rank {rank} default timeout", record_property)


@pytest.mark.rpc_private_agent
@pytest.mark.needs(rpc_feature="fault_injection")
def test_zero_timeout_means_no_timeout(rpc_agent):
    """timeout=0 disables the timeout: a request delayed past the agent's short default still succeeds."""
    for rank, got in enumerate(rpc_agent.run(delayed_with_no_timeout)):
        assert not got.raised and torch.equal(got.value, torch.ones(2) + rank), \
            f"rank {rank}: timeout=0 call {got.describe()} after {got.seconds:.2f} s"
        assert got.seconds >= DELAY_S - 0.05, f"rank {rank}: the delayed call took only {got.seconds:.2f} s"
