"""Contract: rpc_async returns a torch Future that behaves like one.

The call returns before the remote function finishes (the future is not yet
done); ``wait`` gives the value; ``then`` continuations run after completion
and see it, in a chain; ``torch.futures.wait_all`` over many RPC futures
returns every value in order; when one fails it raises that error, and
when several fail, the error of the first one to fail, without waiting for
slower ones ("first error wins").
"""


import pytest
import torch

from fixtures import rpc_lifecycle as lifecycle

from suites.rpc import udfs
from suites.rpc.common import outcome_of, peer_name
from fixtures.rank import ctx

SLOW_S = 0.6  # a call that is still running while the clause looks at its future
MANY = 8
NESTED_TIMEOUT_S = 5.0  # the nested call's own timeout: a deadlocked agent fails the clause in this time


# ---------------------------------------------------------------- rank side
def pending_then_done():
    fut = lifecycle.rpc().rpc_async(peer_name(), udfs.sleep_then, args=(SLOW_S, ctx.rank))
    done_at_once = fut.done()
    value = fut.wait()
    return done_at_once, value, fut.done()


def then_chain():
    fut = lifecycle.rpc().rpc_async(peer_name(), udfs.add, args=(torch.ones(2), ctx.rank))
    seen = []
    doubled = fut.then(lambda f: seen.append("first") or f.wait() * 2)
    plus_one = doubled.then(lambda f: seen.append("second") or f.wait() + 1)
    return plus_one.wait(), seen


def then_waits_on_another_rpc():
    rpc = lifecycle.rpc()

    def add_one_remotely(fut):  # blocks the thread completing ``fut`` until the nested call answers
        return rpc.rpc_async(peer_name(), torch.add, args=(fut.wait(), 1), timeout=NESTED_TIMEOUT_S).wait()

    fut = rpc.rpc_async(peer_name(), torch.add, args=(torch.ones(2), 1), timeout=NESTED_TIMEOUT_S)
    return outcome_of(lambda: fut.then(add_one_remotely).wait())


def wait_all_values():
    rpc = lifecycle.rpc()
    futs = [rpc.rpc_async(peer_name(), udfs.add, args=(ctx.rank * 100, i)) for i in range(MANY)]
    return torch.futures.wait_all(futs)


def wait_all_with_failures(with_late_error):
    rpc = lifecycle.rpc()
    futs = [rpc.rpc_async(peer_name(), udfs.sleep_then, args=(SLOW_S, "slow ok"))]
    if with_late_error:  # listed before the early one: only completion order picks the early one
        futs.append(rpc.rpc_async(peer_name(), udfs.sleep_then_raise, args=(SLOW_S, "late error")))
    futs.append(rpc.rpc_async(peer_name(), udfs.raise_expected, args=("early error", "ValueError")))
    got = outcome_of(torch.futures.wait_all, futs)
    for fut in futs:  # leave nothing in flight for the next clause
        try:
            fut.wait()
        except Exception:
            pass
    return got


# ---------------------------------------------------------------- clauses
def test_rpc_async_returns_before_completion(rpc_agent):
    """rpc_async returns a future that is not done while the remote call runs, and done with its value after wait()."""
    for rank, (done_at_once, value, done_after) in enumerate(rpc_agent.run(pending_then_done)):
        assert not done_at_once, f"rank {rank}: the future of a {SLOW_S} s call was done immediately"
        assert value == rank and done_after, f"rank {rank}: value {value!r}, done {done_after}"


def test_then_continuations_run_in_order(rpc_agent):
    """then() continuations of an RPC future run after it completes, in chain order, and see its value."""
    for rank, (value, seen) in enumerate(rpc_agent.run(then_chain)):
        assert torch.equal(value, (torch.ones(2) + rank) * 2 + 1), f"rank {rank}: {value}"
        assert seen == ["first", "second"], f"rank {rank}: continuations ran as {seen}"


def test_then_callback_may_wait_on_another_rpc(rpc_agent):
    """A then() callback that waits on another RPC to the same peer completes (tensor([3., 3.])), no deadlock."""
    for rank, got in enumerate(rpc_agent.run(then_waits_on_another_rpc)):
        assert not got.raised and torch.equal(got.value, torch.full((2,), 3.0)), f"rank {rank}: {got.describe()}"


def test_wait_all_returns_values_in_order(rpc_agent):
    """torch.futures.wait_all over many RPC futures returns every value, in the futures' order."""
    for rank, values in enumerate(rpc_agent.run(wait_all_values)):
        assert values == [rank * 100 + i for i in range(MANY)], f"rank {rank}: {values}"


def test_wait_all_raises_a_failed_futures_error(rpc_agent):
    """wait_all over RPC futures of which one fails raises that future's error (type and message)."""
    for rank, got in enumerate(rpc_agent.run(wait_all_with_failures, False)):
        assert got.error_type == "ValueError" and "early error" in got.error, f"rank {rank}: {got.describe()}"


@pytest.mark.needs(rpc_feature="wait_all_early_error")
def test_wait_all_first_error_wins(rpc_agent, record_property):
    """wait_all raises the error of the first future to fail, before slower futures (one failing later) finish."""
    results = rpc_agent.run(wait_all_with_failures, True)
    record_property("finding", results[0].describe()[:300])
    for rank, got in enumerate(results):
        assert got.raised and "early error" in got.error, f"rank {rank}: {got.describe()}"
        assert got.seconds < SLOW_S, f"rank {rank}: wait_all took {got.seconds:.2f} s, waiting for the slow futures"
