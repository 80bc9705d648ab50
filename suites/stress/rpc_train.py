"""What every rank runs for the distributed-training benchmark of suites/stress/rpc.py (``--benchmarks train``).

Rank 0 is a parameter server holding a small MLP (Linear 32->64, tanh,
Linear 64->8; each forward reads a snapshot of the weights, see
ps_forward); every other rank is a trainer. A trainer step is the RPC
training stack end to end, as PyTorch's RPC parameter-server tutorial does it:

    with autograd.context() as cid:
        out = rpc_sync(ps, ps_forward, (x,))          # forward over RPC
        loss = mse(out, y)                              # local
        autograd.backward(cid, [loss])                  # distributed backward
        optimizer.step(cid)                             # DistributedOptimizer(SGD) on the server

All trainers share the one model (no lock beyond the optimizer's: the
tutorial's Hogwild-style server). Each trainer times every step
(perf_counter_ns) after ``warmup`` untimed steps; all ranks meet at a
barrier before and after the timed part. The agent's own modules are used
(backends/rpc_agents.py: torch's for tensorpipe, the reference package's for
the reference agents). ``wrong`` counts non-finite losses, and a server
whose parameters did not move.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn, optim

from backends import rpc_agents
from fixtures.rank import ctx

D_IN, D_HIDDEN, D_OUT, BATCH, LR = 32, 64, 8, 16, 0.01
_model: nn.Module | None = None  # the parameter server's model (rank 0)
_agent_name = ""  # the agent under test in this rank (set by measure)


def ps_forward(x: torch.Tensor) -> torch.Tensor:
    """The server's MLP on x, from a snapshot of its weights.

    Trainers step the shared weights in place while others are between
    forward and backward; autograd would refuse their backward (a saved
    tensor "modified by an inplace operation"). Cloning is differentiable,
    so gradients still reach the weights: an asynchronous parameter server.
    """
    w1, b1, w2, b2 = (p.clone() for p in _model.parameters())
    return torch.tanh(x @ w1.t() + b1) @ w2.t() + b2


def ps_parameter_rrefs():
    rpc = rpc_agents.api(_agent_name)
    return [rpc.RRef(p) for p in _model.parameters()]


def prepare(agent: str) -> bool:
    """Import the agent's training stack before anything is timed or under a measurement's deadline.

    torch.distributed.optim imports much of torch.distributed (FSDP, DTensor,
    sympy): seconds on a loaded machine, once per process.
    """
    rpc_agents.autograd(agent), rpc_agents.optim(agent)
    return True


def _make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.Tanh(), nn.Linear(D_HIDDEN, D_OUT))


def measure(agent: str, *, steps: int, warmup: int) -> dict:
    """Rank 0 serves; the others train ``steps`` timed steps each. Collective."""
    global _model, _agent_name
    _agent_name = agent
    rpc, autograd = rpc_agents.api(agent), rpc_agents.autograd(agent)
    DistributedOptimizer = rpc_agents.optim(agent).DistributedOptimizer
    ps = rpc_agents.worker_name(0)
    if ctx.rank == 0:
        _model = _make_model()
        before = [p.detach().clone() for p in _model.parameters()]
    dist.barrier()  # the model exists
    if ctx.rank == 0:
        dist.barrier()  # trainers warmed up
        dist.barrier()  # trainers done
        moved = any(not torch.equal(a, p.detach()) for a, p in zip(before, _model.parameters()))
        _model = None
        return {"rank": 0, "timed": False, "seconds": 0.0, "calls": 0, "warmup": warmup, "samples_ns": None,
                "wrong": 0 if moved else 1, "profile": None}

    gen = torch.Generator().manual_seed(ctx.rank)
    data = [(torch.randn(BATCH, D_IN, generator=gen), torch.randn(BATCH, D_OUT, generator=gen)) for _ in range(8)]
    dist_optim = DistributedOptimizer(optim.SGD, rpc.rpc_sync(ps, ps_parameter_rrefs), lr=LR)

    def step(i: int) -> float:
        x, y = data[i % len(data)]
        with autograd.context() as context_id:
            loss = ((rpc.rpc_sync(ps, ps_forward, (x,)) - y) ** 2).mean()
            autograd.backward(context_id, [loss])
            dist_optim.step(context_id)
        return loss.item()

    losses = [step(i) for i in range(warmup)]
    dist.barrier()
    clock = time.perf_counter_ns
    samples_ns = []
    started = clock()
    for i in range(steps):
        before_step = clock()
        losses.append(step(i))
        samples_ns.append(clock() - before_step)
    elapsed_ns = clock() - started
    dist.barrier()
    wrong = sum(1 for loss in losses if not torch.isfinite(torch.tensor(loss)))
    return {"rank": ctx.rank, "timed": True, "seconds": elapsed_ns / 1e9, "calls": steps, "warmup": warmup,
            "samples_ns": samples_ns, "wrong": wrong, "profile": None}
