"""Contract: graceful shutdown lets work in flight finish; after shutdown a call raises a clear error.

``shutdown(graceful=True)`` on every worker returns only after outstanding
calls completed, so a future taken before shutdown holds its value. A call
made after shutdown raises RuntimeError saying RPC is not initialised (or
shut down), never hangs or reaches a peer. Graceful shutdown has no timeout of
its own: workers that reach it further apart than the RPC timeout all return.
(Each clause runs on an agent of its own, as it ends it.)
"""

import re
import time

import pytest
import torch

from fixtures import rpc_lifecycle as lifecycle

from suites.rpc import udfs
from suites.rpc.common import outcome_of, peer_name
from fixtures.rank import ctx

IN_FLIGHT_S = 0.5
SHORT_RPC_TIMEOUT_S = 0.5  # the agent's RPC timeout while one worker reaches shutdown late
LATE_S = 1.5  # how much later than the others rank 1 calls shutdown (three RPC timeouts)
CLEAR_ERROR = r"(?i)not (been )?initiali[sz]ed|init_rpc|shut ?down"

pytestmark = pytest.mark.rpc_private_agent


# ---------------------------------------------------------------- rank side
def shutdown_with_work_in_flight():
    with lifecycle.private_agent() as rpc:
        futs = [rpc.rpc_async(peer_name(), udfs.sleep_then, args=(IN_FLIGHT_S, ctx.rank * 10 + i)) for i in range(3)]
        lifecycle.stop(graceful=True)  # rpc.shutdown(graceful=True), and the rank forgets the agent
        done = [f.done() for f in futs]
        values = [f.wait() for f in futs] if all(done) else None
    return done, values


def shutdown_with_a_late_worker():
    with lifecycle.private_agent(rpc_timeout=SHORT_RPC_TIMEOUT_S):
        if ctx.rank == 1:
            time.sleep(LATE_S)
        return outcome_of(lifecycle.stop, graceful=True)


def call_after_shutdown():
    with lifecycle.private_agent() as rpc:
        lifecycle.stop(graceful=True)
        return outcome_of(rpc.rpc_sync, peer_name(), udfs.add, args=(torch.ones(1), 1))


# ---------------------------------------------------------------- clauses
def test_graceful_shutdown_completes_work_in_flight(rpc_agent):
    """shutdown(graceful=True) returns after calls in flight completed; their futures hold the values."""
    for rank, (done, values) in enumerate(rpc_agent.run(shutdown_with_work_in_flight)):
        assert all(done), f"rank {rank}: futures done after graceful shutdown: {done}"
        assert values == [rank * 10 + i for i in range(3)], f"rank {rank}: values {values}"


@pytest.mark.waits  # one worker reaches shutdown 1.5 s late
def test_graceful_shutdown_waits_for_a_late_worker_beyond_the_rpc_timeout(rpc_agent):
    """Graceful shutdown waits for a worker that reaches it 3 RPC timeouts later; every worker's returns."""
    for rank, got in enumerate(rpc_agent.run(shutdown_with_a_late_worker)):
        assert not got.raised, f"rank {rank}: shutdown with rank 1 {LATE_S} s late {got.describe()}"


def test_call_after_shutdown_raises_clear_error(rpc_agent, record_property):
    """A call after shutdown raises RuntimeError saying RPC is not initialised / shut down."""
    results = rpc_agent.run(call_after_shutdown)
    record_property("finding", results[0].describe()[:200])
    for rank, got in enumerate(results):
        assert got.error_type == "RuntimeError" and re.search(CLEAR_ERROR, got.error), \
            f"rank {rank}: call after shutdown {got.describe()}"
