"""Contract: DDP inside a distributed autograd context leaves the averaged gradient in that context.

torch's DDP-with-RPC pattern (ddp_under_dist_autograd_test.py, DdpComparisonTest):
a DistributedDataParallel model trained inside ``dist_autograd.context()`` with
``dist_autograd.backward(context_id, [loss])``. DDP's reducer averages the
gradients over the process group and writes the result into the *current
context* (reducer.cpp ``runGradCallbackForVariable``): ``get_gradients(context_id)``
gives each parameter the average over ranks, the same value local DDP writes
to ``.grad`` on the same inputs, and ``.grad`` is left untouched. Outside a
context DDP writes ``.grad`` as always. The same holds under ``Join`` with
uneven inputs (ranks that ran out contribute nothing, the sum is divided by
the initial world size), for sparse gradients (``nn.EmbeddingBag(sparse=True)``:
the context holds a sparse average) and when the model's input comes from an
RPC (the leaf sent gets its local, un-averaged gradient in the same context).

Each agent pairs with the DDP that knows its contexts (``AgentSpec.ddp_module``
in backends/rpc_agents.py): torch's for TensorPipe, backends/reference/ddp for
the reference agents. Expected values are closed-form: a ``Linear`` layer fed
rank-dependent batches, loss ``output.sum()``, whose weight gradient is the
column sums of the batch.
"""

from __future__ import annotations

import torch
from torch import nn

from backends import rpc_agents
from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.dist_autograd.common import autograd, leaves, mul, peer_name, rpc

BASE_BATCH = ((1.0, 2.0), (3.0, 4.0))  # rank r trains on (r + 1) * BASE_BATCH
COLUMN_SUMS = torch.tensor([[4.0, 6.0]])  # BASE_BATCH's column sums: d(sum(x @ w.T + b)) / dw for x = BASE_BATCH
ROWS = len(BASE_BATCH)
EMBEDDINGS = 4


def rank_batch(rank: int) -> torch.Tensor:
    return torch.tensor(BASE_BATCH) * (rank + 1)


def sparse_indices(rank: int) -> list[int]:
    """Two bags of two indices each; rank-dependent so the average differs from every rank's own gradient."""
    return [rank % EMBEDDINGS, (rank + 1) % EMBEDDINGS, (rank + 1) % EMBEDDINGS, EMBEDDINGS - 1]


def mean_over_ranks(world_size: int) -> torch.Tensor:
    """The averaged weight gradient: mean over ranks r of (r + 1) * COLUMN_SUMS."""
    return COLUMN_SUMS * (world_size + 1) / 2


# ---------------------------------------------------------------- rank side
def ddp_wrap(module: nn.Module) -> nn.Module:
    """``module`` in the DistributedDataParallel of this rank's agent, over the default group."""
    return rpc_agents.ddp(lifecycle.current_name()).DistributedDataParallel(module)


def linear(bias: bool = True) -> nn.Linear:
    """Linear(2, 1) with fixed weights [[1, 2]] (and bias 0.5): the same on every rank before DDP broadcasts."""
    layer = nn.Linear(2, 1, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
        if bias:
            layer.bias.fill_(0.5)
    return layer


def in_context() -> tuple:
    mod = autograd()
    model = linear()
    ddp = ddp_wrap(model)
    with mod.context() as context_id:
        loss = ddp(rank_batch(ctx.rank)).sum()
        mod.backward(context_id, [loss])
        grads = mod.get_gradients(context_id)
        return grads.get(model.weight), grads.get(model.bias), len(grads), model.weight.grad, model.bias.grad


def outside_context() -> tuple:
    model = linear()
    ddp = ddp_wrap(model)
    ddp(rank_batch(ctx.rank)).sum().backward()
    return model.weight.grad, model.bias.grad


def context_then_local(iterations: int) -> list:
    """torch's DdpComparisonTest: per iteration, the context's gradients and then local DDP's ``.grad``."""
    mod = autograd()
    torch.manual_seed(ctx.rank)  # different inputs per rank: the average differs from each rank's own gradient
    model = nn.Linear(2, 3)
    ddp = ddp_wrap(model)
    pairs = []
    for _ in range(iterations):
        inputs = torch.rand(3, 2)
        with mod.context() as context_id:
            mod.backward(context_id, [ddp(inputs).norm()])
            in_ctx = mod.get_gradients(context_id)
            in_ctx = {name: in_ctx.get(p) for name, p in model.named_parameters()}
        ddp.zero_grad()
        ddp(inputs).norm().backward()
        pairs.append((in_ctx, {name: p.grad.clone() for name, p in model.named_parameters()}))
    return pairs


def uneven_under_join() -> tuple[list, list]:
    """Rank r trains r + 1 iterations under DDP's Join: in a context, then local DDP on the same batch."""
    mod = autograd()
    model = linear(bias=False)
    ddp = ddp_wrap(model)
    in_ctx, local = [], []
    with ddp.join():
        for _ in range(ctx.rank + 1):
            with mod.context() as context_id:
                mod.backward(context_id, [ddp(rank_batch(ctx.rank)).sum()])
                in_ctx.append(mod.get_gradients(context_id).get(model.weight))
            ddp.zero_grad()
            ddp(rank_batch(ctx.rank)).sum().backward()
            local.append(model.weight.grad.clone())
    return in_ctx, local


def sparse_in_context() -> tuple:
    mod = autograd()
    model = nn.EmbeddingBag(EMBEDDINGS, 2, mode="sum", sparse=True)
    with torch.no_grad():
        model.weight.copy_(torch.arange(2.0 * EMBEDDINGS).reshape(EMBEDDINGS, 2))
    ddp = ddp_wrap(model)
    indices, offsets = torch.tensor(sparse_indices(ctx.rank)), torch.tensor([0, 2])
    with mod.context() as context_id:
        mod.backward(context_id, [ddp(indices, offsets).sum()])
        grads = mod.get_gradients(context_id)
        grad = grads.get(model.weight)
        return (None if grad is None else grad.is_sparse), (None if grad is None else grad.to_dense()), \
            len(grads), model.weight.grad


def rpc_input_in_context() -> tuple:
    """The DDP model's input is x * a computed on the peer, a a local leaf: both in one context."""
    mod = autograd()
    (a,) = leaves([1.0, 2.0])
    model = linear()
    ddp = ddp_wrap(model)
    with mod.context() as context_id:
        hidden = rpc().rpc_sync(peer_name(), mul, args=(rank_batch(ctx.rank), a))
        mod.backward(context_id, [ddp(hidden).sum()])
        grads = mod.get_gradients(context_id)
        return grads.get(a), grads.get(model.weight), grads.get(model.bias), model.weight.grad


# ---------------------------------------------------------------- clauses
def test_ddp_inside_a_context_averages_into_the_context(rpc_agent):
    """DDP backward inside a context: get_gradients holds the average over ranks; .grad stays None."""
    want = mean_over_ranks(rpc_agent.world_size)
    for rank, (gw, gb, count, grad_w, grad_b) in enumerate(rpc_agent.run(in_context)):
        assert gw is not None and gb is not None, \
            f"rank {rank}: the context holds no gradient for weight ({gw}) or bias ({gb}); .grad: {grad_w}, {grad_b}"
        torch.testing.assert_close(gw, want, msg=lambda m: f"rank {rank}: weight gradient in the context: {m}")
        torch.testing.assert_close(gb, torch.tensor([float(ROWS)]),
                                   msg=lambda m: f"rank {rank}: bias gradient in the context: {m}")
        assert count == 2, f"rank {rank}: {count} gradient entries, expected weight and bias"
        assert grad_w is None and grad_b is None, f"rank {rank}: .grad was written: {grad_w}, {grad_b}"


def test_ddp_outside_a_context_averages_into_grad(rpc_agent):
    """DDP backward outside any context, with the agent running: .grad holds the average over ranks."""
    want = mean_over_ranks(rpc_agent.world_size)
    for rank, (grad_w, grad_b) in enumerate(rpc_agent.run(outside_context)):
        assert grad_w is not None, f"rank {rank}: weight.grad is None"
        torch.testing.assert_close(grad_w, want, msg=lambda m: f"rank {rank}: weight.grad: {m}")
        torch.testing.assert_close(grad_b, torch.tensor([float(ROWS)]), msg=lambda m: f"rank {rank}: bias.grad: {m}")


def test_ddp_context_gradients_equal_local_ddp(rpc_agent):
    """Two iterations, norm loss, rank-seeded inputs: the context's gradients equal local DDP's .grad on the same inputs."""
    for rank, pairs in enumerate(rpc_agent.run(context_then_local, 2)):
        for i, (in_ctx, local) in enumerate(pairs):
            for name, want in local.items():
                got = in_ctx[name]
                assert got is not None, f"rank {rank}, iteration {i}: no gradient for {name} in the context"
                torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank}, iteration {i}, {name}: "
                                                                    f"context vs local DDP: {m}")


def test_ddp_uneven_inputs_under_join(rpc_agent):
    """Rank r trains r + 1 iterations under Join: iteration i's gradient, in the context and local, is the sum over ranks >= i divided by the world size."""
    n = rpc_agent.world_size
    for rank, (in_ctx, local) in enumerate(rpc_agent.run(uneven_under_join)):
        assert len(in_ctx) == len(local) == rank + 1, f"rank {rank}: {len(in_ctx)} iterations, expected {rank + 1}"
        for i, (got, got_local) in enumerate(zip(in_ctx, local)):
            want = COLUMN_SUMS * sum(r + 1 for r in range(i, n)) / n
            assert got is not None, f"rank {rank}, iteration {i}: no weight gradient in the context"
            torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank}, iteration {i}, in the context: {m}")
            torch.testing.assert_close(got_local, want, msg=lambda m: f"rank {rank}, iteration {i}, .grad: {m}")


def test_ddp_sparse_gradients_inside_a_context(rpc_agent):
    """EmbeddingBag(sparse=True) under DDP inside a context: one sparse entry, the average of the ranks' index counts; .grad stays None."""
    n = rpc_agent.world_size
    want = torch.zeros(EMBEDDINGS, 2)
    for r in range(n):
        for index in sparse_indices(r):
            want[index] += 1.0 / n
    for rank, (is_sparse, dense, count, grad) in enumerate(rpc_agent.run(sparse_in_context)):
        assert dense is not None, f"rank {rank}: the context holds no gradient for the embedding weight"
        assert is_sparse and count == 1, f"rank {rank}: sparse {is_sparse}, {count} entries (expected one sparse)"
        torch.testing.assert_close(dense, want, msg=lambda m: f"rank {rank}: embedding gradient in the context: {m}")
        assert grad is None, f"rank {rank}: .grad was written: {grad}"


def test_ddp_on_an_rpc_result_inside_a_context(rpc_agent):
    """DDP on x * a computed by the peer: the DDP weight gets the average over ranks, the sent leaf a its own local gradient, both in the context."""
    n = rpc_agent.world_size
    a, w = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])
    for rank, (ga, gw, gb, grad_w) in enumerate(rpc_agent.run(rpc_input_in_context)):
        assert ga is not None and gw is not None and gb is not None, \
            f"rank {rank}: missing context gradients: a {ga}, weight {gw}, bias {gb}"
        torch.testing.assert_close(gw, mean_over_ranks(n) * a, msg=lambda m: f"rank {rank}: DDP weight: {m}")
        torch.testing.assert_close(gb, torch.tensor([float(ROWS)]), msg=lambda m: f"rank {rank}: DDP bias: {m}")
        torch.testing.assert_close(ga, w * COLUMN_SUMS[0] * (rank + 1), msg=lambda m: f"rank {rank}: sent leaf a: {m}")
        assert grad_w is None, f"rank {rank}: .grad was written: {grad_w}"
