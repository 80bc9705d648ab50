"""Contract: an exception raised by a remote function comes back to the caller with its type and message.

Whatever way the function was called (rpc_sync, rpc_async's future, remote's
to_here, a method called through an RRef proxy), the caller gets an exception
of the same type (a builtin one, and a ValueError subclass defined in
suites/rpc/udfs.py) whose message contains the original message. The callee also reports it in
its own log (stderr or logging), so an operator of the callee can see it.
A failed call leaves the agent usable: the next call to the same worker works.
"""

import pytest
import torch

from fixtures.rank import ctx
from fixtures import rpc_lifecycle as lifecycle
from suites.rpc import udfs
from suites.rpc.call_modes import CALLS
from suites.rpc.common import barrier, callee_log, outcome_of, peer_name


def message_from(rank):
    return f"planned failure raised for caller rank {rank}"


# ---------------------------------------------------------------- rank side
def call_raising(rpc_call, type_name):
    rpc, to, msg, mode = lifecycle.rpc(), peer_name(), message_from(ctx.rank), CALLS[rpc_call]
    if mode.through_rref:  # the method of a Counter the peer owns
        counter = rpc.remote(to, udfs.Counter, args=(0,))
        got = outcome_of(mode.invoke_method, counter, "fail", msg, type_name)
    else:
        got = outcome_of(mode.invoke, rpc, to, udfs.raise_expected, (msg, type_name))
    after = rpc.rpc_sync(to, udfs.add, args=(torch.ones(1), 1))  # the agent still works
    return got, bool(torch.equal(after, torch.full((1,), 2.0)))


def raise_while_capturing_log():
    rpc = lifecycle.rpc()
    with callee_log() as log:
        barrier("capturing")
        got = outcome_of(rpc.rpc_sync, peer_name(), udfs.raise_expected, args=(message_from(ctx.rank),))
        barrier("all-called")
    return got, "".join(log)


def builtin_with_bad_shapes():
    return outcome_of(lifecycle.rpc().rpc_sync, peer_name(), torch.add, args=(torch.ones(2), torch.ones(3)))


# ---------------------------------------------------------------- clauses
def _exception_params():
    params = []
    for rpc_call in CALLS:
        params.append(pytest.param(rpc_call, "ValueError", id=f"{rpc_call}-builtin_type"))
        custom = pytest.mark.needs(rpc_feature="custom_exception_type")
        params.append(pytest.param(rpc_call, "ExpectedError", id=f"{rpc_call}-subclass_type", marks=[custom]))
    return params


@pytest.mark.parametrize(("rpc_call", "type_name"), _exception_params())
def test_remote_exception_keeps_type_and_message(rpc_agent, rpc_call, type_name, record_property):
    """A remote function's exception (builtin or a user subclass) is re-raised on the caller with its type and message; the agent stays usable."""
    results = rpc_agent.run(call_raising, rpc_call, type_name)
    record_property("finding", f"{type_name} via {rpc_call}: {results[0][0].error_type}")
    for rank, (got, still_works) in enumerate(results):
        assert got.error_type == type_name, f"rank {rank} via {rpc_call}: {got.describe()}, expected {type_name}"
        assert message_from(rank) in got.error, \
            f"rank {rank} via {rpc_call}: message lost: {got.error!r}"
        assert still_works, f"rank {rank}: a call after the failed {rpc_call} call returned a wrong value"


def test_remote_exception_is_logged_on_callee(rpc_agent):
    """The callee reports a remote function's exception in its own log (stderr or logging) with the message."""
    results = rpc_agent.run(raise_while_capturing_log)
    n = rpc_agent.world_size
    for rank, (got, log) in enumerate(results):
        assert got.raised, f"rank {rank}: {got.describe()}"
        caller = (rank - 1) % n  # rank r is called by rank r-1
        want = message_from(caller)
        assert want in log, f"worker{rank} (callee of rank {caller}) did not log the exception; its log:\n{log[-2000:]}"


def test_builtin_error_is_runtime_error(rpc_agent, record_property):
    """A builtin operator that fails on the callee (mismatched shapes) raises RuntimeError on the caller."""
    results = rpc_agent.run(builtin_with_bad_shapes)
    record_property("finding", results[0].describe()[:200])
    for rank, got in enumerate(results):
        assert got.error_type == "RuntimeError", f"rank {rank}: {got.describe()}"
