"""Rank side of tests/test_reference_optim_shim.py: the reference DistributedOptimizer driven by a TEST SHIM.

``ShimDistAutograd`` is NOT distributed autograd and not the reference
implementation (that is backends/reference/rpc/autograd.py, built
separately). It only files gradients under a context id, the way
``get_gradients`` presents them on an owner, so the optimizer's own logic
(owners grouped, one local optimizer per owner, functional vs
non-functional path, the caller-side context check, errors coming back)
can be checked on the reference agents before and independently of the
real thing. Each owner computes its parameter's gradient with local
autograd on a loss that separates by parameter, so no gradient has to
cross a worker.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

import backends.reference.rpc as rpc
from backends.reference.rpc import optim as reference_optim
from fixtures.rank import ctx
from suites.dist_autograd import training
from suites.rpc.common import barrier
from tests.rpc_cases.agent_fns import name, running


class ShimDistAutograd:
    """TEST SHIM: a table context id -> {parameter: gradient}; gradients are filed, never computed across workers."""

    def __init__(self):
        self.contexts: dict[int, dict] = {}
        self.lock = threading.Lock()

    def open(self, context_id: int) -> None:
        with self.lock:
            self.contexts.setdefault(context_id, {})

    def file(self, context_id: int, param: torch.Tensor, grad: torch.Tensor) -> None:
        with self.lock:
            self.contexts.setdefault(context_id, {})[param] = grad

    def _is_valid_context(self, context_id: int) -> None:
        if context_id not in self.contexts:
            raise RuntimeError(f"Could not find autograd context with id: {context_id}")

    def get_gradients(self, context_id: int) -> dict:
        self._is_valid_context(context_id)
        with self.lock:
            return dict(self.contexts[context_id])


SHIM = ShimDistAutograd()


@contextmanager
def shimmed():
    """The reference optimizer reads gradients from SHIM in this process while the block runs."""
    saved = reference_optim._autograd
    reference_optim._autograd = lambda: SHIM
    try:
        yield
    finally:
        reference_optim._autograd = saved
        SHIM.contexts.clear()


def shim_open(context_id: int) -> None:
    SHIM.open(context_id)


def owner_backward(context_id: int, rref, x: torch.Tensor, y: torch.Tensor) -> None:
    """On the owner: the gradient of this parameter's part of the loss, filed under the context."""
    w = rref.local_value()
    (grad,) = torch.autograd.grad(((x @ w - y) ** 2).mean(), w)
    SHIM.file(context_id, w, grad)


def separable_data(seed: int, steps: int):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 4, generator=gen), torch.randn(5, 2, generator=gen), torch.randn(5, 2, generator=gen))
            for _ in range(steps)]


def train(optimizer: str, steps: int, prefix: str) -> dict:
    """Two parameters on the next two workers; per step a context, owner-side gradients, DistributedOptimizer.step."""
    cls, kwargs = training.OPTIMIZERS[optimizer]
    owners = [name((ctx.rank + 1) % ctx.world_size), name((ctx.rank + 2) % ctx.world_size)]
    inits = [torch.randn(4, 2, generator=torch.Generator().manual_seed(ctx.rank * 10 + i)) for i in range(2)]
    with shimmed(), running(prefix=prefix):
        barrier(f"{prefix}-shimmed")  # every owner reads from the shim before any step arrives
        rrefs = [rpc.remote(o, training.make_param, (w,)) for o, w in zip(owners, inits)]
        dist_optim = reference_optim.DistributedOptimizer(cls, rrefs, **kwargs)
        for k, (x, y1, y2) in enumerate(separable_data(ctx.rank, steps)):
            context_id = (ctx.rank << 48) + k + 1
            SHIM.open(context_id)
            for owner, rref, y in zip(owners, rrefs, (y1, y2)):
                rpc.rpc_sync(owner, owner_backward, (context_id, rref, x, y))
            dist_optim.step(context_id)
        got = [r.to_here().detach() for r in rrefs]
        grads = [rpc.rpc_sync(o, training.param_grad, (r,)) for o, r in zip(owners, rrefs)]
        unknown = _error(dist_optim.step, 12345)
        failing = reference_optim.DistributedOptimizer(training.FailingStep, rrefs[:1], lr=0.1)
        SHIM.open(777)
        rpc.rpc_sync(owners[0], shim_open, (777,))  # real dist autograd: the step's own RPC carries the context
        step_error = _error(failing.step, 777)
        ctor_error = _error(reference_optim.DistributedOptimizer, training.FailingConstructor, rrefs, lr=0.1)
        barrier(f"{prefix}-done")  # nobody shuts down while a peer still steps on it
    local = [w.clone().requires_grad_() for w in inits]
    local_optim = cls(local, **kwargs)
    for x, y1, y2 in separable_data(ctx.rank, steps):
        local_optim.zero_grad()
        (((x @ local[0] - y1) ** 2).mean() + ((x @ local[1] - y2) ** 2).mean()).backward()
        local_optim.step()
    return {"got": got, "want": [w.detach() for w in local], "functional": dist_optim.is_functional_optim,
            "grads": grads, "unknown": unknown, "step_error": step_error, "ctor_error": ctor_error}


def _error(call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None
