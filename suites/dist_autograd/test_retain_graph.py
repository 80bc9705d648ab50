"""Contract: ``retain_graph=True`` keeps every worker's graph, and each backward adds into the context.

Three passes with ``retain_graph=True`` leave 1x, 2x, 3x the gradient. Without
it a pass frees the buffers it used on every worker: the next pass through a
node that saved tensors fails with torch's "Trying to backward through the
graph a second time", prefixed "Error on Node {id}: " per worker on the way
back, and leaves the gradients as they were; a graph that saved nothing
(add, sum) runs again and accumulates.
"""

import re

import torch

from suites.dist_autograd.common import add, autograd, leaves, mul, outcome_of, peer_name, rpc

SECOND_TIME = "Trying to backward through the graph a second time"


# ---------------------------------------------------------------- rank side
def retained_three_times():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    seen = []
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        for _ in range(3):
            outcome = outcome_of(mod.backward, context_id, [loss], retain_graph=True)
            if outcome.raised:
                return seen, outcome
            grads = mod.get_gradients(context_id)
            seen.append((grads[t1].clone(), grads[t2].clone()))
    return seen, None


def second_pass_without_retain(remote: bool):
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        if remote:
            loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        else:
            loss = (t1 * t2).sum()
        mod.backward(context_id, [loss])
        second = outcome_of(mod.backward, context_id, [loss])
        grads = mod.get_gradients(context_id)
        return second, grads[t1], grads[t2]


def rerun_without_saved_tensors():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), add, args=(t1, t2)).sum()
        mod.backward(context_id, [loss])
        second = outcome_of(mod.backward, context_id, [loss])
        grads = mod.get_gradients(context_id)
        return second, grads[t1], grads[t2]


# ---------------------------------------------------------------- clauses
def test_retain_graph_passes_accumulate(rpc_agent):
    """Three backward passes with retain_graph=True through a remote mul leave 1x, 2x, 3x the gradient."""
    for rank, (seen, failed) in enumerate(rpc_agent.run(retained_three_times)):
        assert failed is None, f"rank {rank}: pass {len(seen) + 1} with retain_graph=True {failed.describe()}"
        for n, (g1, g2) in enumerate(seen, start=1):
            assert torch.equal(g1, n * torch.tensor([3.0, 4.0])) and torch.equal(g2, n * torch.tensor([1.0, 2.0])), \
                f"rank {rank}: after pass {n}: {g1}, {g2}; expected {n}x [3, 4] and {n}x [1, 2]"


def test_second_pass_without_retain_fails_on_the_remote_node(rpc_agent):
    """Without retain_graph a second pass through a remote mul fails: "Error on Node {me}: Error on Node {peer}: Trying to backward through the graph a second time"; gradients stay."""
    for rank, (second, g1, g2) in enumerate(rpc_agent.run(second_pass_without_retain, True)):
        want = rf"^Error on Node {rank}: Error on Node {(rank + 1) % rpc_agent.world_size}: {SECOND_TIME}"
        assert second.raised and re.search(want, second.error), f"rank {rank}: second pass {second.describe()}"
        assert torch.equal(g1, torch.tensor([3.0, 4.0])) and torch.equal(g2, torch.tensor([1.0, 2.0])), \
            f"rank {rank}: the failed pass changed the gradients: {g1}, {g2}"


def test_second_local_pass_without_retain_fails(rpc_agent):
    """Without retain_graph a second pass through a local mul fails with "Error on Node {me}: Trying to backward through the graph a second time"."""
    for rank, (second, g1, _) in enumerate(rpc_agent.run(second_pass_without_retain, False)):
        assert second.raised and re.search(rf"^Error on Node {rank}: {SECOND_TIME}", second.error), \
            f"rank {rank}: second pass {second.describe()}"
        assert torch.equal(g1, torch.tensor([3.0, 4.0])), f"rank {rank}: {g1}"


def test_graph_without_saved_tensors_reruns(rpc_agent):
    """A remote add then sum saves no tensors: a second pass without retain_graph succeeds and accumulates 2x."""
    for rank, (second, g1, g2) in enumerate(rpc_agent.run(rerun_without_saved_tensors)):
        assert not second.raised, f"rank {rank}: second pass {second.describe()}"
        assert torch.equal(g1, torch.full((2,), 2.0)) and torch.equal(g2, torch.full((2,), 2.0)), \
            f"rank {rank}: {g1} {g2}"


def shared_leaf_second_pass():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        # t1 reaches the loss both locally (through a mul that saves tensors) and through the RPC
        loss = (t1 * rpc().rpc_sync(peer_name(), add, args=(t1, t2))).sum()
        mod.backward(context_id, [loss])
        second = outcome_of(mod.backward, context_id, [loss])
        return second, mod.get_gradients(context_id)[t1]


def test_second_pass_fails_when_a_leaf_is_shared_with_an_rpc(rpc_agent):
    """loss = (t1 * rpc_sync(peer, add, (t1, t2))).sum(): without retain_graph a second pass fails on this worker's mul; the first gave t1 -> 2 t1 + t2."""
    for rank, (second, g1) in enumerate(rpc_agent.run(shared_leaf_second_pass)):
        assert second.raised and re.search(rf"^Error on Node {rank}: {SECOND_TIME}", second.error), \
            f"rank {rank}: second pass {second.describe()}"
        assert torch.equal(g1, torch.tensor([5.0, 8.0])), f"rank {rank}: t1 -> {g1}"
