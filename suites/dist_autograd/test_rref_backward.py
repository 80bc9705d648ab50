"""Contract: ``RRef.backward(dist_autograd_ctx_id=-1, retain_graph=False)`` runs autograd from the RRef's value.

On an owner RRef without a context id it is a local ``torch.autograd.backward``
(``.grad`` is filled); with one it is a distributed backward from the value,
gradients in the context. A user RRef needs a context id ("User RRefs require
'dist_autograd_ctx_id' to be specified") and asks the owner to run the
backward there: gradients reach the caller's leaves, ``retain_graph=True``
allows another pass that accumulates, and the owner's errors come back with
their text (not a tensor, not a scalar, not requiring grad, unknown context).
"""

import re

import torch

from suites.dist_autograd.common import (UNKNOWN, autograd, leaves, mul, mul_sum, outcome_of, peer_name, plain_ones, rpc,
                                         unknown_id)

NOT_TENSOR = "RRef should contain a tensor for .backward()"
NEEDS_CONTEXT = "User RRefs require 'dist_autograd_ctx_id' to be specified"


# ---------------------------------------------------------------- rank side
def owner_local_backward():
    (t,) = leaves([1.0, 2.0])
    rpc().RRef(t.sum() + t.sum()).backward()
    return t.grad


def owner_dist_backward():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        rpc().RRef(loss).backward(context_id)
        grads = mod.get_gradients(context_id)
        return grads[t1], grads[t2], t1.grad


def owner_not_a_tensor():
    (t,) = leaves([1.0])
    return [outcome_of(rpc().RRef(value).backward) for value in ("foo", [t.sum()])]


def user_needs_context():
    (t,) = leaves([1.0, 2.0])
    rref = rpc().remote(peer_name(), torch.sum, args=(t,))
    return outcome_of(rref.backward)


def user_backward_retained():
    mod = autograd()
    (t,) = leaves([1.0, 2.0, 3.0])
    with mod.context() as context_id:
        rref = rpc().remote(peer_name(), torch.sum, args=(t,))
        rref.backward(context_id, retain_graph=True)
        first = mod.get_gradients(context_id)[t].clone()
        rref.backward(dist_autograd_ctx_id=context_id)
        return first, mod.get_gradients(context_id)[t]


def user_backward_through_mul():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        rref = rpc().remote(peer_name(), mul_sum, args=(t1, t2))
        rref.backward(context_id)
        grads = mod.get_gradients(context_id)
        return grads[t1], grads[t2]


def user_backward_errors():
    mod = autograd()
    (t,) = leaves([1.0, 2.0])
    with mod.context() as context_id:
        not_scalar = rpc().remote(peer_name(), torch.add, args=(t, 1))
        no_grad = rpc().remote(peer_name(), plain_ones, args=(1,))
        text = rpc().remote(peer_name(), str, args=("foo",))
        scalar = rpc().remote(peer_name(), torch.sum, args=(t,))
        return [outcome_of(not_scalar.backward, context_id), outcome_of(no_grad.backward, context_id),
                outcome_of(text.backward, context_id)], unknown_id(), outcome_of(scalar.backward, unknown_id())


# ---------------------------------------------------------------- clauses
def test_owner_rref_without_context_is_local_backward(rpc_agent):
    """RRef(t.sum() + t.sum()).backward() on its owner fills t.grad with 2."""
    for rank, grad in enumerate(rpc_agent.run(owner_local_backward)):
        assert grad is not None and torch.equal(grad, torch.full((2,), 2.0)), f"rank {rank}: t.grad {grad}"


def test_owner_rref_with_context_is_distributed(rpc_agent):
    """RRef(loss).backward(context_id) on its owner: a distributed backward, gradients in the context, .grad untouched."""
    for rank, (g1, g2, grad) in enumerate(rpc_agent.run(owner_dist_backward)):
        assert torch.equal(g1, torch.tensor([3.0, 4.0])) and torch.equal(g2, torch.tensor([1.0, 2.0])), \
            f"rank {rank}: {g1} {g2}"
        assert grad is None, f"rank {rank}: t1.grad {grad}"


def test_owner_rref_of_a_non_tensor_raises(rpc_agent):
    """RRef("foo").backward() and RRef([t.sum()]).backward() raise "RRef should contain a tensor for .backward()"."""
    for rank, outcomes in enumerate(rpc_agent.run(owner_not_a_tensor)):
        for outcome in outcomes:
            assert outcome.error_type == "RuntimeError" and outcome.error.startswith(NOT_TENSOR), \
                f"rank {rank}: {outcome.describe()}"


def test_user_rref_needs_a_context_id(rpc_agent):
    """A user RRef's backward() without a context id raises "User RRefs require 'dist_autograd_ctx_id' to be specified"."""
    for rank, outcome in enumerate(rpc_agent.run(user_needs_context)):
        assert outcome.error_type == "RuntimeError" and outcome.error.startswith(NEEDS_CONTEXT), \
            f"rank {rank}: {outcome.describe()}"


def test_user_rref_backward_with_retain_graph_accumulates(rpc_agent):
    """remote(peer, torch.sum, (t,)).backward(id, retain_graph=True) then .backward(dist_autograd_ctx_id=id): t gets 1, then 2."""
    for rank, (first, second) in enumerate(rpc_agent.run(user_backward_retained)):
        assert torch.equal(first, torch.ones(3)) and torch.equal(second, torch.full((3,), 2.0)), \
            f"rank {rank}: {first} then {second}"


def test_user_rref_backward_reaches_the_callers_leaves(rpc_agent):
    """A user RRef to (t1 * t2).sum() on its owner: backward(id) gives the caller t1 -> t2, t2 -> t1."""
    for rank, (g1, g2) in enumerate(rpc_agent.run(user_backward_through_mul)):
        assert torch.equal(g1, torch.tensor([3.0, 4.0])) and torch.equal(g2, torch.tensor([1.0, 2.0])), \
            f"rank {rank}: {g1} {g2}"


def test_user_rref_backward_errors_come_from_the_owner(rpc_agent):
    """Owner-side failures reach the user RRef's caller: not a scalar, requires_grad not set, not a tensor, unknown context."""
    texts = (" is not a scalar, all roots need to be scalar", "requires_grad not set on root", NOT_TENSOR)
    for rank, (outcomes, missing, unknown) in enumerate(rpc_agent.run(user_backward_errors)):
        for outcome, text in zip(outcomes, texts):
            assert outcome.error_type == "RuntimeError" and re.search(re.escape(text), outcome.error), \
                f"rank {rank}: expected {text!r}, got {outcome.describe()}"
        assert re.search(re.escape(UNKNOWN.format(missing)), unknown.error), f"rank {rank}: {unknown.describe()}"
