"""Contract: ``to=`` names the callee by rank, by worker name or by WorkerInfo, and a bad ``to`` fails clearly.

A rank number, the worker's name and its WorkerInfo all reach the same
worker; get_worker_info() without a name describes the caller itself (its
name and id = its rank). A rank outside [0, world size) raises RuntimeError,
a fractional rank raises ValueError, an unknown name raises an error that
names it; none of them hangs or reaches another worker.
"""

import pytest
import torch

from backends.rpc_agents import worker_name
from fixtures import rpc_lifecycle as lifecycle
from suites.rpc import udfs
from suites.rpc.call_modes import CALLS, RPC_ASYNC, RPC_SYNC
from suites.rpc.common import outcome_of, peer

BAD_NAME = "no-such-worker-7"


# ---------------------------------------------------------------- rank side
def reach_peer_three_ways():
    rpc = lifecycle.rpc()
    info = rpc.get_worker_info(worker_name(peer()))
    return {
        "rank": rpc.rpc_sync(peer(), udfs.whoami),
        "name": rpc.rpc_sync(worker_name(peer()), udfs.whoami),
        "worker_info": rpc.rpc_sync(info, udfs.whoami),
        "info_fields": (info.name, info.id),
    }


def describe_self():
    info = lifecycle.rpc().get_worker_info()
    return info.name, info.id


def call_bad_destination(to, rpc_call=RPC_SYNC.name):
    return outcome_of(CALLS[rpc_call].invoke, lifecycle.rpc(), to, udfs.add, (torch.ones(1), 1))


# ---------------------------------------------------------------- clauses
def test_rank_name_and_worker_info_reach_the_same_worker(rpc_agent):
    """to= a rank, that worker's name or its WorkerInfo all run the call on that worker."""
    for rank, got in enumerate(rpc_agent.run(reach_peer_three_ways)):
        want = worker_name((rank + 1) % rpc_agent.world_size)
        assert got["info_fields"] == (want, (rank + 1) % rpc_agent.world_size), f"rank {rank}: WorkerInfo {got['info_fields']}"
        for how in ("rank", "name", "worker_info"):
            assert got[how] == want, f"rank {rank}: to= by {how} ran on {got[how]}, expected {want}"


def test_get_worker_info_without_name_is_self(rpc_agent):
    """get_worker_info() with no name is the caller: its own worker name and id = rank."""
    assert rpc_agent.run(describe_self) == [(worker_name(r), r) for r in range(rpc_agent.world_size)]


@pytest.mark.parametrize("how", ["rank_equal_to_world_size", "negative_rank"])
def test_rank_out_of_range_raises_runtime_error(rpc_agent, how, record_property):
    """to= a rank outside [0, world size) raises RuntimeError on the caller."""
    to = rpc_agent.world_size if how == "rank_equal_to_world_size" else -1
    results = rpc_agent.run(call_bad_destination, to)
    record_property("finding", f"to={to}: {results[0].describe()}")
    for rank, got in enumerate(results):
        assert got.error_type == "RuntimeError", f"rank {rank}: to={to} {got.describe()}, expected RuntimeError"


def test_fractional_rank_raises_value_error(rpc_agent, record_property):
    """to= a fractional rank (1.5) raises ValueError on the caller."""
    results = rpc_agent.run(call_bad_destination, 1.5)
    record_property("finding", f"to=1.5: {results[0].describe()}")
    for rank, got in enumerate(results):
        assert got.error_type == "ValueError", f"rank {rank}: to=1.5 {got.describe()}, expected ValueError"


@pytest.mark.parametrize("rpc_call", (RPC_SYNC.name, RPC_ASYNC.name))
def test_unknown_name_raises_error_naming_it(rpc_agent, rpc_call, record_property):
    """to= an unknown worker name raises an error whose message names it."""
    results = rpc_agent.run(call_bad_destination, BAD_NAME, rpc_call)
    record_property("finding", f"to={BAD_NAME!r}: {results[0].describe()}")
    for rank, got in enumerate(results):
        assert got.raised and BAD_NAME in got.error, \
            f"rank {rank}: {rpc_call} to unknown {BAD_NAME!r} {got.describe()} (the error must name it)"
