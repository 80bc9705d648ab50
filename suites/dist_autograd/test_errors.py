"""Contract: a failing backward raises on the caller, in time and with a text naming where it failed.

An exception raised by a backward function on any worker reaches the caller
of ``backward`` as RuntimeError with "Error on Node {id}: " per worker on the
way back (torch's "Error on Node 0: Error on Node 1: Simulate error on
backward pass"), and the context stays usable: once the callee stops
raising, another pass over the same (retained) graph succeeds. Backward checks its arguments
in torch's order and with torch's texts: unknown context, no roots, a root
not requiring grad, not a scalar, without a grad function (RuntimeError),
arguments of the wrong type or keyword (TypeError "incompatible function
arguments"; the first parameter's keyword is ``contextId``). An exception
in the forward call inside a context is the caller's as usual. A worker that
stops answering mid-backward makes backward raise the agent's timeout error
within the RPC timeout; a send function that never receives gradients (FAST
mode: every RPC recorded in the context must contribute to the roots) makes
it fail within the RPC timeout naming it, where torch's FAST mode waits
forever (gap ``unused_send_function``).
"""

import re
import time

import pytest
import torch

from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.dist_autograd.common import (SIMULATED, UNKNOWN, autograd, error_in_backward, fail_when_told, leaves,
                                         mul, nested_error, outcome_of, peer_name, rpc, set_backward_failure,
                                         since_the_stall, slow_mul, unknown_id)
from suites.rpc.common import barrier
from suites.rpc import udfs

STALL_TIMEOUT_S = 1.5  # the private agent's RPC timeout in the lost-worker clauses
STALL_S = 4.0  # how long the stalled worker's backward blocks
SLACK_S = 3.0  # two cores shared by many processes


# ---------------------------------------------------------------- rank side
def remote_backward_error():
    mod = autograd()
    (t,) = leaves([1.0, 2.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), error_in_backward, args=(t,)).sum()
        failed = outcome_of(mod.backward, context_id, [loss])
        usable = outcome_of(lambda: len(mod.get_gradients(context_id)))
    return failed, usable


def nested_backward_error():
    mod = autograd()
    (t,) = leaves([1.0, 2.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), nested_error, args=(peer_name(2), t)).sum()
        return outcome_of(mod.backward, context_id, [loss])


def local_backward_error():
    mod = autograd()
    (t,) = leaves([1.0, 2.0])
    with mod.context() as context_id:
        return outcome_of(mod.backward, context_id, [error_in_backward(t).sum()])


def unknown_context():
    mod = autograd()
    (t,) = leaves([1.0, 2.0])
    return unknown_id(), outcome_of(mod.backward, unknown_id(), [(t * 2).sum()])


def invalid_roots():
    mod = autograd()
    with mod.context() as context_id:
        return [outcome_of(mod.backward, context_id, roots) for roots in
                ([], [torch.rand(1)], [torch.rand(3, 3, requires_grad=True).sum(0)],
                 [torch.rand(1, requires_grad=True)])]


def invalid_argument_types():
    mod = autograd()
    (t,) = leaves([1.0])
    root = (t * 2).sum()
    with mod.context() as context_id:
        return [outcome_of(call) for call in (
            lambda: mod.backward(context_id, None),
            lambda: mod.backward(None, None),
            lambda: mod.backward(context_id, root),
            lambda: mod.backward(context_id=context_id, roots=[root]),
        )] + [outcome_of(lambda: mod.backward(contextId=context_id, roots=[root], retain_graph=False))]


def forward_error_in_context():
    mod = autograd()
    (t,) = leaves([1.0])
    with mod.context():
        return outcome_of(rpc().rpc_sync, peer_name(), udfs.raise_expected, args=("forward marker", "ValueError"))


def stalled_worker():
    with lifecycle.private_agent(rpc_timeout=STALL_TIMEOUT_S):
        mod = autograd()
        t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
        with mod.context() as context_id:
            loss = rpc().rpc_sync(peer_name(), slow_mul, args=(t1, t2, STALL_S)).sum()
            outcome = outcome_of(mod.backward, context_id, [loss])
            return since_the_stall(outcome, time.monotonic(), (ctx.rank + 1) % ctx.world_size)


def unused_send_function():
    with lifecycle.private_agent(rpc_timeout=STALL_TIMEOUT_S):
        mod = autograd()
        t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
        with mod.context() as context_id:
            rpc().rpc_sync(peer_name(), mul, args=(t1, t2))  # recorded, then not used by the loss
            sends = list(mod._current_context()._send_functions())
            return sends, outcome_of(mod.backward, context_id, [(t1 * 2).sum()])


# ---------------------------------------------------------------- clauses
def test_remote_backward_error_reaches_the_caller(rpc_agent):
    """A backward function raising on the callee: RuntimeError "Error on Node {me}: Error on Node {peer}: Simulate error on backward pass"; the context stays usable."""
    for rank, (failed, usable) in enumerate(rpc_agent.run(remote_backward_error)):
        want = rf"^Error on Node {rank}: Error on Node {(rank + 1) % rpc_agent.world_size}: {SIMULATED}"
        assert failed.error_type == "RuntimeError" and re.search(want, failed.error), \
            f"rank {rank}: {failed.describe()}"
        assert not usable.raised, f"rank {rank}: get_gradients after the failed pass {usable.describe()}"


@pytest.mark.min_world_size(3)
def test_nested_backward_error_names_every_hop(rpc_agent):
    """An error two hops away comes back as "Error on Node {me}: Error on Node {next}: Error on Node {last}: Simulate error on backward pass"."""
    n = rpc_agent.world_size
    for rank, failed in enumerate(rpc_agent.run(nested_backward_error)):
        want = rf"^Error on Node {rank}: Error on Node {(rank + 1) % n}: Error on Node {(rank + 2) % n}: {SIMULATED}"
        assert re.search(want, failed.error), f"rank {rank}: {failed.describe()}"


def test_local_backward_error(rpc_agent):
    """A backward function raising on the caller itself: "Error on Node {me}: Simulate error on backward pass"."""
    for rank, failed in enumerate(rpc_agent.run(local_backward_error)):
        assert failed.error_type == "RuntimeError" and re.search(rf"^Error on Node {rank}: {SIMULATED}", failed.error), \
            f"rank {rank}: {failed.describe()}"


def test_backward_of_unknown_context(rpc_agent):
    """backward with a context id that was never issued raises "Could not find autograd context with id: {id}"."""
    for rank, (context_id, failed) in enumerate(rpc_agent.run(unknown_context)):
        assert failed.error_type == "RuntimeError" and failed.error.startswith(UNKNOWN.format(context_id)), \
            f"rank {rank}: {failed.describe()}"


def test_invalid_roots_are_refused_with_torchs_texts(rpc_agent):
    """Roots [], not requiring grad, not a scalar, a leaf: torch's four RuntimeErrors, in that order of checks."""
    texts = ("No tensors provided for gradient computation.", "requires_grad not set on root",
             " is not a scalar, all roots need to be scalar", " does not have a valid gradient function.")
    for rank, outcomes in enumerate(rpc_agent.run(invalid_roots)):
        for outcome, text in zip(outcomes, texts):
            assert outcome.error_type == "RuntimeError" and outcome.error.startswith(text), \
                f"rank {rank}: expected {text!r}, got {outcome.describe()}"


def test_invalid_argument_types_are_type_errors(rpc_agent):
    """backward(id, None), backward(None, None), a bare tensor as roots, the keyword context_id: TypeError "incompatible function arguments"; contextId= works."""
    for rank, outcomes in enumerate(rpc_agent.run(invalid_argument_types)):
        *bad, good = outcomes
        for outcome in bad:
            assert outcome.error_type == "TypeError" and "incompatible function arguments" in outcome.error, \
                f"rank {rank}: {outcome.describe()}"
        assert not good.raised, f"rank {rank}: backward(contextId=..., roots=...) {good.describe()}"


def test_forward_error_inside_a_context(rpc_agent):
    """A remote function raising in the forward pass inside a context raises on the caller with its text."""
    for outcome in rpc_agent.run(forward_error_in_context):
        assert outcome.error_type == "ValueError" and "forward marker" in outcome.error, outcome.describe()


@pytest.mark.rpc_private_agent
@pytest.mark.waits  # the worker's backward stalls 4 s
def test_worker_stalled_mid_backward_fails_within_the_timeout(rpc_agent):
    """The callee's part of the pass blocks past the RPC timeout: backward raises the agent's timeout error within the timeout (plus slack), never hangs."""
    for rank, outcome in enumerate(rpc_agent.run(stalled_worker)):
        assert outcome.raised and re.search(rpc_agent.spec.timeout_error, outcome.error), \
            f"rank {rank}: {outcome.describe()}"
        assert outcome.seconds < STALL_TIMEOUT_S + SLACK_S, f"rank {rank}: raised after {outcome.seconds:.1f} s"


@pytest.mark.rpc_private_agent
@pytest.mark.needs(rpc_feature="unused_send_function")
@pytest.mark.waits  # the RPC timeout expires
def test_unused_send_function_fails_within_the_timeout(rpc_agent):
    """An RPC recorded in the context that does not contribute to the loss: backward fails within the RPC timeout naming the send function that got no gradients."""
    for rank, (sends, outcome) in enumerate(rpc_agent.run(unused_send_function)):
        assert outcome.raised and f"send function {sends[0]}" in outcome.error and "FAST mode" in outcome.error, \
            f"rank {rank}: {outcome.describe()}"
        assert outcome.seconds < STALL_TIMEOUT_S + SLACK_S, f"rank {rank}: raised after {outcome.seconds:.1f} s"


def error_then_success():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), fail_when_told, args=(t1, t2)).sum()
        barrier("forward-done")  # every worker's forward ran before any flag changes
        rpc().rpc_sync(peer_name(), set_backward_failure, args=(True,))
        failed = outcome_of(mod.backward, context_id, [loss], retain_graph=True)
        barrier("failed-pass-done")  # the flag is shared by every caller of this worker
        rpc().rpc_sync(peer_name(), set_backward_failure, args=(False,))
        barrier("flag-off")
        second = outcome_of(mod.backward, context_id, [loss], retain_graph=True)
        grads = mod.get_gradients(context_id)
        return failed, second, grads.get(t1), grads.get(t2)


def test_context_usable_after_a_failed_pass(rpc_agent):
    """A pass that fails on the callee (its backward raises), then the same graph again once it stops raising: the second pass succeeds and gives the gradients."""
    for rank, (failed, second, g1, g2) in enumerate(rpc_agent.run(error_then_success)):
        assert failed.raised and SIMULATED in failed.error, f"rank {rank}: first pass {failed.describe()}"
        assert not second.raised, f"rank {rank}: second pass {second.describe()}"
        assert torch.equal(g1, torch.tensor([3.0, 4.0])) and torch.equal(g2, torch.tensor([1.0, 2.0])), \
            f"rank {rank}: {g1} {g2}"
