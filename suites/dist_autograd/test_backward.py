"""Contract: ``backward(context_id, roots)`` computes the local graph's gradients into the context, across RPCs.

Seed gradients are ones; every root adds its share. The gradient of each leaf
is the one the same graph gives when run in one process, kept in the context
of the worker where the leaf lives (``get_gradients(context_id)``: a new dict
per call, leaf -> gradient, only leaves that require grad), never written to
``.grad`` (None stays None, a preset value stays). A tensor sent with
requires_grad but unused by the callee gets zeros; each gradient keeps its
leaf's dtype and shape (views, 0-d tensors; a tensor passed twice gets both
shares); tensor hooks apply to the stored gradient, and a post hook on a
leaf's AccumulateGrad node runs once per backward (DDP's reducer hooks
there), with ``.grad`` still untouched. A purely local graph
works inside a context; backward may run from a thread without a current
context, and several contexts may run backward concurrently.
"""

import threading

import torch

from fixtures.rank import ctx
from suites.dist_autograd.common import (add, autograd, leaves, local_grads, mul, pair_out, peer_name, rpc,
                                         times_two_first)


# ---------------------------------------------------------------- rank side
def one_root():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    t2.grad = torch.full((3,), 7.0)
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        mod.backward(context_id, [loss])
        grads = mod.get_gradients(context_id)
        again = mod.get_gradients(context_id=context_id)
        return (grads.get(t1), grads.get(t2), len(grads), t1.grad, t2.grad, grads is not again,
                all(again[k] is grads[k] for k in grads))


def several_roots():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 5.0])
    with mod.context() as context_id:
        r1 = rpc().rpc_sync(peer_name(), torch.add, args=(t1, t2)).sum()
        r2 = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        r3 = (5 * t1).sum()
        mod.backward(context_id, (r1, r2, r3))  # a tuple of roots is accepted too
        grads = mod.get_gradients(context_id)
        return grads[t1], grads[t2]


def mixed_dtypes():
    mod = autograd()
    (x32,) = leaves([1.0, 2.0])
    others = {d: torch.tensor([3.0, 4.0], dtype=d, requires_grad=True)
              for d in (torch.float64, torch.float16, torch.bfloat16)}
    with mod.context() as context_id:
        loss = sum(rpc().rpc_sync(peer_name(), add, args=(x, x32.to(d))).float().sum() for d, x in others.items())
        mod.backward(context_id, [loss])
        grads = mod.get_gradients(context_id)
        return grads[x32], {str(d): grads[x] for d, x in others.items()}


def unused_tensor():
    mod = autograd()
    a, b = leaves([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), times_two_first, args=(a, b)).sum()
        mod.backward(context_id, [loss])
        grads = mod.get_gradients(context_id)
        return grads.get(a), grads.get(b)


def mixed_requires_grad():
    mod = autograd()
    (t1,) = leaves([1.0, 2.0])
    t3 = torch.tensor([3.0, 4.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t3)).sum()
        mod.backward(context_id, [loss])
        grads = mod.get_gradients(context_id)
        return list(grads) == [t1], grads.get(t1), t3 in grads


def local_graph():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        mod.backward(context_id, [(t1 + t2).sum()])
        grads = mod.get_gradients(context_id)
        return len(grads), grads[t1], grads[t2], t1.grad


def accumulate_grad_hooked_leaf():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    accumulate_grad = t1.view_as(t1).grad_fn.next_functions[0][0]  # a leaf has no grad_fn of its own
    calls = []
    accumulate_grad.register_hook(lambda grad_inputs, grad_outputs: calls.append(1))
    runs = []
    for _ in range(2):
        with mod.context() as context_id:
            loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
            mod.backward(context_id, [loss])
        runs.append(len(calls))
    return runs, t1.grad


def hooked_leaf():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    t1.register_hook(lambda grad: grad * 2)
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        mod.backward(context_id, [loss])
        grads = mod.get_gradients(context_id)
        return grads[t1], grads[t2]


def several_outputs():
    mod = autograd()
    a, b = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        product, total = rpc().rpc_sync(peer_name(), pair_out, args=(a, b))
        loss = (product * total).sum()
        mod.backward(context_id, [loss])
        grads = mod.get_gradients(context_id)
        want = local_grads(lambda x, y: (x * y * (x + y)).sum(), a, b)
        return grads[a], grads[b], want


def backward_from_another_thread():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        errors = []

        def run():
            try:
                mod.backward(context_id, [loss])
            except Exception as exc:  # reported below
                errors.append(repr(exc))
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(60)
        grads = mod.get_gradients(context_id)
        return errors, grads.get(t1), grads.get(t2)


def concurrent_contexts():
    mod = autograd()
    results, errors = {}, []

    def worker(i):
        try:
            a, b = leaves([float(i), 1.0], [2.0, float(i + ctx.rank)])
            with mod.context() as context_id:
                loss = rpc().rpc_sync(peer_name(), mul, args=(a, b)).sum()
                mod.backward(context_id, [loss])
                grads = mod.get_gradients(context_id)
                results[i] = (torch.equal(grads[a], b.detach()), torch.equal(grads[b], a.detach()))
        except Exception as exc:  # reported below
            errors.append(repr(exc))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


# ---------------------------------------------------------------- clauses
def test_one_root_gradients_land_in_the_context(rpc_agent):
    """loss = rpc_sync(peer, mul, (t1, t2)).sum(): get_gradients gives t1 -> t2 and t2 -> t1; .grad is untouched (None stays None, 7.0 stays 7.0)."""
    for rank, (g1, g2, count, grad1, grad2, fresh, same) in enumerate(rpc_agent.run(one_root)):
        assert g1 is not None and g2 is not None, f"rank {rank}: the context holds no gradient for t1 ({g1}) or t2 ({g2})"
        assert torch.equal(g1, torch.tensor([4.0, 5.0, 6.0])) and torch.equal(g2, torch.tensor([1.0, 2.0, 3.0])), \
            f"rank {rank}: gradients {g1}, {g2}"
        assert count == 2, f"rank {rank}: {count} gradient entries, expected t1 and t2 only"
        assert grad1 is None and torch.equal(grad2, torch.full((3,), 7.0)), \
            f"rank {rank}: .grad was written: t1.grad {grad1}, t2.grad {grad2} (preset 7.0)"
        assert fresh and same, "get_gradients: a new dict per call holding the same gradient tensors"


def test_several_roots_add_their_shares(rpc_agent):
    """Roots [add(t1, t2).sum(), mul(t1, t2).sum(), (5 * t1).sum()]: t1 gets 1 + t2 + 5, t2 gets 1 + t1."""
    for rank, (g1, g2) in enumerate(rpc_agent.run(several_roots)):
        assert torch.equal(g1, torch.tensor([9.0, 11.0])) and torch.equal(g2, torch.tensor([2.0, 3.0])), \
            f"rank {rank}: gradients {g1}, {g2}"


def test_gradients_keep_each_leafs_dtype(rpc_agent):
    """float64, float16 and bfloat16 leaves combined with float32 over RPC: each gradient is ones in its leaf's dtype."""
    for rank, (g32, others) in enumerate(rpc_agent.run(mixed_dtypes)):
        assert torch.equal(g32, torch.full((2,), 3.0)), f"rank {rank}: float32 leaf gradient {g32}"
        for name, grad in others.items():
            assert str(grad.dtype) == name and torch.equal(grad.float(), torch.ones(2)), \
                f"rank {rank}: {name} leaf gradient {grad}"


def test_unused_tensor_gets_zeros(rpc_agent):
    """A tensor sent with requires_grad but unused by the callee gets a zero gradient; the used one 2."""
    for rank, (ga, gb) in enumerate(rpc_agent.run(unused_tensor)):
        assert torch.equal(ga, torch.full((3,), 2.0)), f"rank {rank}: used tensor gradient {ga}"
        assert gb is not None and torch.equal(gb, torch.zeros(3)), f"rank {rank}: unused tensor gradient {gb}"


def test_tensors_not_requiring_grad_get_no_entry(rpc_agent):
    """mul(t1, t3) with t3 not requiring grad: only t1 has a gradient (t3's values)."""
    for rank, (only_t1, g1, t3_in) in enumerate(rpc_agent.run(mixed_requires_grad)):
        assert only_t1 and not t3_in and torch.equal(g1, torch.tensor([3.0, 4.0])), \
            f"rank {rank}: entries only t1 {only_t1}, t1 {g1}, t3 present {t3_in}"


def test_local_graph_inside_a_context(rpc_agent):
    """A graph without any RPC inside a context: two entries of ones, .grad untouched."""
    for rank, (count, g1, g2, grad) in enumerate(rpc_agent.run(local_graph)):
        assert count == 2 and torch.equal(g1, torch.ones(2)) and torch.equal(g2, torch.ones(2)) and grad is None, \
            f"rank {rank}: {count} entries {g1} {g2}, t1.grad {grad}"


def test_tensor_hooks_apply_to_the_stored_gradient(rpc_agent):
    """A hook doubling t1's gradient (register_hook) is applied to what the context stores."""
    for rank, (g1, g2) in enumerate(rpc_agent.run(hooked_leaf)):
        assert torch.equal(g1, torch.tensor([6.0, 8.0])) and torch.equal(g2, torch.tensor([1.0, 2.0])), \
            f"rank {rank}: gradients {g1} (hooked x2), {g2}"


def test_accumulate_grad_post_hook_runs_once_per_backward(rpc_agent):
    """A post hook on a leaf's AccumulateGrad node runs exactly once per distributed backward; .grad stays None."""
    for rank, (runs, grad) in enumerate(rpc_agent.run(accumulate_grad_hooked_leaf)):
        assert runs == [1, 2] and grad is None, \
            f"rank {rank}: the AccumulateGrad post hook had run {runs} times after backward 1 and 2; t1.grad {grad}"


def test_several_results_of_one_call(rpc_agent):
    """A remote function returning (a * b, a + b): gradients through both equal the local graph's."""
    for rank, (ga, gb, (wa, wb)) in enumerate(rpc_agent.run(several_outputs)):
        assert torch.allclose(ga, wa) and torch.allclose(gb, wb), f"rank {rank}: {ga} {gb}, local {wa} {wb}"


def test_backward_from_a_thread_without_current_context(rpc_agent):
    """backward(context_id, ...) from a thread that has no current context computes the same gradients."""
    for rank, (errors, g1, g2) in enumerate(rpc_agent.run(backward_from_another_thread)):
        assert not errors, f"rank {rank}: {errors}"
        assert torch.equal(g1, torch.tensor([3.0, 4.0])) and torch.equal(g2, torch.tensor([1.0, 2.0])), \
            f"rank {rank}: {g1} {g2}"


def test_concurrent_contexts_keep_their_own_gradients(rpc_agent):
    """Eight threads, each with its own context, call and run backward at once: each context holds its own gradients."""
    for rank, (results, errors) in enumerate(rpc_agent.run(concurrent_contexts)):
        assert not errors, f"rank {rank}: {errors}"
        assert results == {i: (True, True) for i in range(8)}, f"rank {rank}: {results}"


def odd_layouts():
    mod = autograd()
    base = torch.arange(6.0).reshape(2, 3).requires_grad_()
    scalar = torch.tensor(2.0, requires_grad=True)
    (twice,) = leaves([1.0, 2.0])
    with mod.context() as context_id:
        product = rpc().rpc_sync(peer_name(), mul, args=(base.t(), scalar))  # a transposed view and a 0-d leaf
        doubled = rpc().rpc_sync(peer_name(), add, args=(twice, twice))  # one tensor, two arguments
        mod.backward(context_id, [(product * product).sum() + doubled.sum()])
        grads = mod.get_gradients(context_id)
        want_base, want_scalar = local_grads(lambda b, s: ((b.t() * s) ** 2).sum(), base, scalar)
        return grads.get(base), want_base, grads.get(scalar), want_scalar, grads.get(twice)


def test_views_scalars_and_repeated_arguments(rpc_agent):
    """A transposed view of a leaf and a 0-d leaf sent over RPC, and one tensor passed as two arguments: gradients equal the local graph's (the repeated one gets 2)."""
    for rank, (gb, wb, gs, ws, gt) in enumerate(rpc_agent.run(odd_layouts)):
        assert gb is not None and gb.shape == (2, 3) and torch.allclose(gb, wb), f"rank {rank}: base -> {gb}, local {wb}"
        assert gs is not None and gs.shape == () and torch.allclose(gs, ws), f"rank {rank}: scalar -> {gs}, local {ws}"
        assert torch.equal(gt, torch.full((2,), 2.0)), f"rank {rank}: repeated argument -> {gt}"


def profiled_in_context():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with torch.autograd.profiler_legacy.profile() as prof:  # torch profiles RPCs under the legacy profiler only
        with mod.context() as context_id:
            loss = rpc().rpc_sync(peer_name(), torch.mul, args=(t1, t2)).sum()
            mod.backward(context_id, [loss])
            grads = mod.get_gradients(context_id)
    names = sorted({event.name for event in prof.function_events if "rpc_" in event.name})
    return names, grads.get(t1), grads.get(t2)


def test_profiled_rpc_inside_a_context(rpc_agent):
    """Under the legacy profiler an RPC inside a context is recorded with the callee's ops (#remote_op:) and its gradients are still right."""
    n = rpc_agent.world_size
    for rank, (names, g1, g2) in enumerate(rpc_agent.run(profiled_in_context)):
        key = f"rpc_sync#aten::mul(worker{rank} -> worker{(rank + 1) % n})"
        assert key in names and f"{key}#remote_op: aten::mul" in names, f"rank {rank}: profiled {names}"
        assert torch.equal(g1, torch.tensor([3.0, 4.0])) and torch.equal(g2, torch.tensor([1.0, 2.0])), \
            f"rank {rank}: {g1} {g2}"
