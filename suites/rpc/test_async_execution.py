"""Contract: a function decorated with ``@rpc.functions.async_execution`` replies when its returned Future completes.

The callee does not hold a thread while the future is pending; its result is
the future's value: a future chained with ``then`` continuations, a future
of an RPC to a further worker that is itself async (nested), and a future
collecting RPCs to every worker at once (fan-out) all deliver the right value
to the caller, through rpc_sync, rpc_async and remote. An async function
that raises, or whose future completes with an exception, re-raises it on
the caller; one that returns something other than a Future is an error on
the caller, never a hang or a silently returned value.
"""

import pytest
import torch

from backends.rpc_agents import worker_name
from fixtures.rank import ctx
from fixtures import rpc_lifecycle as lifecycle
from suites.rpc import udfs
from suites.rpc.call_modes import CALLS, FUNCTION_CALLS
from suites.rpc.common import outcome_of, peer_name

HOPS = 3
STEP = 2


# ---------------------------------------------------------------- rank side
def chained(rpc_call):
    # the callee's RPC goes back to the caller: a worker serves and calls at once
    x = torch.full((3,), float(ctx.rank))
    return CALLS[rpc_call].invoke(lifecycle.rpc(), peer_name(1), udfs.async_add_chained,
                  (worker_name(ctx.rank), x, STEP, HOPS))


def nested(rpc_call):
    x = torch.full((2,), float(ctx.rank))
    return CALLS[rpc_call].invoke(lifecycle.rpc(), peer_name(1), udfs.async_add_nested, (peer_name(2), x, STEP, HOPS))


def fan_out(rpc_call):
    everyone = [worker_name(r) for r in range(ctx.world_size)]
    return CALLS[rpc_call].invoke(lifecycle.rpc(), peer_name(1), udfs.async_fan_out, (everyone, ctx.rank))


def not_a_future(rpc_call):
    return outcome_of(CALLS[rpc_call].invoke, lifecycle.rpc(), peer_name(), udfs.async_returns_tensor, (torch.ones(2),))


def failing_async(rpc_call, how):
    func = udfs.async_raises if how == "future_set_exception" else udfs.async_raises_before_returning
    return outcome_of(CALLS[rpc_call].invoke, lifecycle.rpc(), peer_name(), func, (f"async failure for rank {ctx.rank}",))


# ---------------------------------------------------------------- clauses
pytestmark = pytest.mark.needs(rpc_feature="async_execution")


@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_async_chained_then(rpc_agent, rpc_call):
    """An async function's future built from an RPC plus ``then`` continuations delivers the chained value."""
    for rank, got in enumerate(rpc_agent.run(chained, rpc_call)):
        assert torch.equal(got, torch.full((3,), float(rank + STEP * HOPS))), f"rank {rank} via {rpc_call}: {got}"


@pytest.mark.min_world_size(3)
@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_async_nested(rpc_agent, rpc_call):
    """An async function returning the future of another worker's async function delivers the inner result (three workers)."""
    for rank, got in enumerate(rpc_agent.run(nested, rpc_call)):
        assert torch.equal(got, torch.full((2,), float(rank + STEP * (HOPS + 1)))), f"rank {rank} via {rpc_call}: {got}"


@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_async_fan_out(rpc_agent, rpc_call):
    """An async function fanning out to every worker at once replies with every worker's answer, in order."""
    n = rpc_agent.world_size
    for rank, got in enumerate(rpc_agent.run(fan_out, rpc_call)):
        assert list(got) == [(worker_name(r), rank + 1) for r in range(n)], f"rank {rank} via {rpc_call}: {got}"


@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_async_raising_before_returning_future(rpc_agent, rpc_call):
    """An async function that raises instead of returning a future re-raises that ValueError on the caller."""
    for rank, got in enumerate(rpc_agent.run(failing_async, rpc_call, "raise")):
        assert got.error_type == "ValueError" and f"async failure for rank {rank}" in got.error, \
            f"rank {rank} via {rpc_call}: {got.describe()}"


@pytest.mark.needs(rpc_feature="async_future_exception")
@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_async_future_exception_is_raised(rpc_agent, rpc_call, record_property):
    """An async function whose future completes with set_exception re-raises that ValueError on the caller."""
    results = rpc_agent.run(failing_async, rpc_call, "future_set_exception")
    record_property("finding", f"{rpc_call}: {results[0].describe()[:200]}")
    for rank, got in enumerate(results):
        assert got.error_type == "ValueError" and f"async failure for rank {rank}" in got.error, \
            f"rank {rank} via {rpc_call}: {got.describe()}"


@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_async_non_future_return_is_error(rpc_agent, rpc_call, record_property):
    """An async function that returns a tensor instead of a Future raises on the caller, naming Future."""
    results = rpc_agent.run(not_a_future, rpc_call)
    record_property("finding", f"{rpc_call}: {results[0].describe()[:300]}")
    for rank, got in enumerate(results):
        assert got.raised and "future" in got.error.lower(), f"rank {rank} via {rpc_call}: {got.describe()}"
