"""Contract: gradients follow RPC chains through any number of workers, back to the caller, and to self.

A chain w0 -> w1 -> ... (each hop a nested rpc_sync), a call back to the
caller (A -> B -> A), calls to self (direct and nested), a ``remote`` whose
owner multiplies by a leaf of its own then ``to_here``, an RRef fetched by a
third worker, a leaf the callee returns, and several round trips in a row:
every leaf's gradient equals the same graph run locally, on the worker where
the leaf lives (the owner's leaf only in the owner's context, its ``.grad``
untouched). ``backward`` returns only when every
worker's part of the pass finished, including parts that do not lead back
to the caller.
"""

import pytest
import torch

from fixtures.rank import ctx
from suites.dist_autograd.common import (autograd, chain, fetch_and_scale, gradient_of_own_leaf, gradients_on_callee,
                                         leaves, local_grads, make_weight, mul, mul_by_rref, nested_mul, outcome_of,
                                         own_name, peer_name, rpc, slow_backward_done, slow_branch_via_self)


def _run_and_compare(make_out, local_fn):
    """backward of (out * out).sum() for out = make_out(a, b); (context gradients, local gradients)."""
    mod = autograd()
    a, b = leaves([1.0, 2.0, 3.0], [0.5, -1.0, 2.0])
    with mod.context() as context_id:
        out = make_out(a, b)
        failed = outcome_of(mod.backward, context_id, [(out * out).sum()])
        grads = mod.get_gradients(context_id)
        got = (grads.get(a), grads.get(b))
    want = local_grads(lambda x, y: (local_fn(x, y) ** 2).sum(), a, b)
    return got, tuple(want), (a.grad, b.grad), failed


# ---------------------------------------------------------------- rank side
def ring_chain():
    hops = [peer_name(k) for k in range(2, ctx.world_size)]  # w(r+1) calls w(r+2) ... up to w(r-1)
    depth = len(hops) + 1
    return _run_and_compare(lambda a, b: rpc().rpc_sync(peer_name(), chain, args=(hops, a, b)),
                            lambda x, y: x * y * 3 ** (depth - 1))


def back_to_caller():
    return _run_and_compare(lambda a, b: rpc().rpc_sync(peer_name(), nested_mul, args=(own_name(), a, b)),
                            lambda x, y: x * y * 2)


def to_self():
    return _run_and_compare(lambda a, b: rpc().rpc_sync(own_name(), mul, args=(a, b)), lambda x, y: x * y)


def to_self_nested():
    return _run_and_compare(lambda a, b: rpc().rpc_sync(own_name(), nested_mul, args=(own_name(), a, b)),
                            lambda x, y: x * y * 2)


def round_trips():
    def out(a, b):
        t = a
        for _ in range(3):
            t = rpc().rpc_sync(peer_name(), mul, args=(t, b))
        return t
    return _run_and_compare(out, lambda x, y: x * y * y * y)


def remote_owner_leaf():
    mod = autograd()
    weight = rpc().remote(peer_name(), make_weight, args=([2.0, 3.0],))
    (x,) = leaves([5.0, 7.0])
    with mod.context() as context_id:
        value = rpc().remote(peer_name(), mul_by_rref, args=(weight, x)).to_here()
        mod.backward(context_id, [(value * value).sum()])
        mine = mod.get_gradients(context_id)
        owner = rpc().rpc_sync(peer_name(), gradients_on_callee, args=(context_id, weight))
        return mine.get(x), len(mine), owner


def completion_waits_for_every_worker():
    mod = autograd()
    (x,) = leaves([1.0, 2.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), slow_branch_via_self, args=(x, 0.5)).sum()
        mod.backward(context_id, [loss])
        done_at_return = rpc().rpc_sync(peer_name(), slow_backward_done)
        return done_at_return, mod.get_gradients(context_id).get(x)


# ---------------------------------------------------------------- clauses
def _check(rank, got, want, grads, failed):
    assert not failed.raised, f"rank {rank}: backward {failed.describe()}"
    assert got[0] is not None and got[1] is not None, f"rank {rank}: missing gradients {got}"
    assert torch.allclose(got[0], want[0]) and torch.allclose(got[1], want[1]), \
        f"rank {rank}: gradients {got}, the local graph gives {want}"
    assert grads == (None, None), f"rank {rank}: .grad was written: {grads}"


@pytest.mark.min_world_size(3)
def test_chain_through_every_worker(rpc_agent):
    """A nested chain through every other worker (w0 -> w1 -> w2 [-> w3]), each hop scaling by 3: gradients equal the local graph's."""
    for rank, (got, want, grads, failed) in enumerate(rpc_agent.run(ring_chain)):
        _check(rank, got, want, grads, failed)


def test_chain_back_to_the_caller(rpc_agent):
    """A -> B -> A: the callee calls back into the caller; gradients equal the local graph's."""
    for rank, (got, want, grads, failed) in enumerate(rpc_agent.run(back_to_caller)):
        _check(rank, got, want, grads, failed)


def test_call_to_self(rpc_agent):
    """rpc_sync to self: gradients equal the local graph's."""
    for rank, (got, want, grads, failed) in enumerate(rpc_agent.run(to_self)):
        _check(rank, got, want, grads, failed)


def test_nested_call_to_self(rpc_agent):
    """A call to self whose function calls self again: gradients equal the local graph's."""
    for rank, (got, want, grads, failed) in enumerate(rpc_agent.run(to_self_nested)):
        _check(rank, got, want, grads, failed)


def test_several_round_trips(rpc_agent):
    """Three rpc_sync calls in a row, each feeding the next: gradients equal the local graph's."""
    for rank, (got, want, grads, failed) in enumerate(rpc_agent.run(round_trips)):
        _check(rank, got, want, grads, failed)


def test_remote_and_to_here_reach_the_owners_leaf(rpc_agent):
    """remote(owner, W * x).to_here(), loss (W * x)^2: the caller gets only x -> 2 W^2 x; the owner's context W -> 2 W x^2, W.grad None."""
    for rank, (gx, count, (gw, w_grad)) in enumerate(rpc_agent.run(remote_owner_leaf)):
        w, x = torch.tensor([2.0, 3.0]), torch.tensor([5.0, 7.0])
        assert count == 1 and gx is not None and torch.allclose(gx, 2 * w * w * x), f"rank {rank}: x -> {gx}"
        assert gw is not None and torch.allclose(gw, 2 * w * x * x), f"rank {rank}: the owner's W -> {gw}"
        assert w_grad is None, f"rank {rank}: the owner's W.grad was written: {w_grad}"


def test_backward_returns_after_every_workers_part(rpc_agent):
    """A callee branch that does not lead back to the caller (a self-call with a slow backward) has finished when backward returns."""
    for rank, (done, gx) in enumerate(rpc_agent.run(completion_waits_for_every_worker)):
        assert done, f"rank {rank}: backward returned before the callee's slow part of the pass finished"
        assert torch.equal(gx, torch.full((2,), 2.0)), f"rank {rank}: x -> {gx}"


def leaf_created_by_callee():
    mod = autograd()
    with mod.context() as context_id:
        leaf = rpc().rpc_sync(peer_name(), make_weight, args=([1.0, 2.0, 3.0],))
        mod.backward(context_id, [(leaf * leaf).sum()])
        mine = mod.get_gradients(context_id)
        callee = rpc().rpc_sync(peer_name(), gradient_of_own_leaf, args=(context_id,))
        return len(mine), callee


def rref_through_a_third_worker():
    mod = autograd()
    weight = rpc().remote(peer_name(), make_weight, args=([2.0, 3.0],))
    (x,) = leaves([5.0, 7.0])
    with mod.context() as context_id:
        product = rpc().rpc_sync(peer_name(2), fetch_and_scale, args=(weight, 4.0)) * x
        mod.backward(context_id, [product.sum()])
        mine = mod.get_gradients(context_id).get(x)
        owner = rpc().rpc_sync(peer_name(), gradients_on_callee, args=(context_id, weight))
        return mine, owner


def test_gradient_of_a_leaf_the_callee_returned(rpc_agent):
    """A callee returns a leaf it created (requires_grad): the caller's loss (leaf^2).sum() puts 2 * leaf in the callee's context, nothing in the caller's."""
    for rank, (count, callee) in enumerate(rpc_agent.run(leaf_created_by_callee)):
        assert count == 0, f"rank {rank}: the caller's context has {count} gradients"
        assert len(callee) == 1 and torch.equal(callee[0], torch.tensor([2.0, 4.0, 6.0])), \
            f"rank {rank}: the callee's context {callee}"


@pytest.mark.min_world_size(3)
def test_rref_fetched_by_a_third_worker(rpc_agent):
    """An RRef to W (owned by w1) passed to w2, which fetches it inside the context: backward of (4 W * x).sum() gives x -> 4 W on the caller and W -> 4 x on the owner."""
    for rank, (gx, (gw, w_grad)) in enumerate(rpc_agent.run(rref_through_a_third_worker)):
        w, x = torch.tensor([2.0, 3.0]), torch.tensor([5.0, 7.0])
        assert gx is not None and torch.equal(gx, 4 * w), f"rank {rank}: x -> {gx}"
        assert gw is not None and torch.equal(gw, 4 * x) and w_grad is None, f"rank {rank}: owner's W -> {gw}, " \
                                                                            f".grad {w_grad}"
