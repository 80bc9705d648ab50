"""torch.distributed.optim.DistributedOptimizer over the reference agents, in plain Python.

``DistributedOptimizer(optimizer_class, params_rref, *args, **kwargs)``
groups the parameter RRefs by owner and builds, with one ``rpc_async`` per
owner, a local optimizer there over the owner's own parameters (the RRefs'
local values). ``step(context_id)`` checks the context on the caller, then
asks every owner to step with the gradients that distributed autograd
stored in that context on that owner (``get_gradients(context_id)``), and
returns when every owner has. Behaviour, texts and the choice between the
two paths are torch 2.13's (torch/distributed/optim/optimizer.py; spec:
../shared/specs/dist-autograd.md section D):

* functional (``optimizer_class`` exactly one of torch's 8 classes with a
  functional twin in ``functional_optim_map``, TorchScript enabled): the
  owner runs the functional optimizer (``_FunctionalSGD`` etc.), stepping
  with a list of gradients aligned with its parameters, None where the
  context has none; ``.grad`` is never touched. torch compiles it to
  TorchScript to step without the GIL; here it runs as the Python class it
  is written as (same arithmetic, same state, same warnings);
* otherwise (``class MySGD(optim.SGD)``, NAdam, ...): the owner sets
  ``param.grad`` to every gradient of the context, then ``optim.step()``,
  under one process-wide lock (torch's ``_LocalOptimizer.global_lock``).

Concurrent steps are serialised on each owner (torch's docstring: one
process-wide lock per path); there is no ordering across owners. A remote error comes back as the exception the
owner raised (the reference agents keep its class; TensorPipe keeps
ValueError/TypeError and turns others into RuntimeError). If several owners
fail, the last one's exception is raised, after every owner answered
(torch's ``_wait_for_all``).

Distributed autograd (``get_gradients``, ``_is_valid_context``) is the
reference package's ``autograd`` module, imported when first needed.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

import torch
import torch.jit as jit

from . import api as rpc
from .rref import RRef

__all__ = ["DistributedOptimizer"]

logger = logging.getLogger(__name__)


def _autograd():
    # lazily: the autograd module imports the agent, and the optimizer is
    # importable (and its constructor usable) without a context
    from . import autograd

    return autograd


class _FunctionalLocalOptimizer:
    """On an owner: a functional optimizer over the owner's parameters, stepped with the context's gradients.

    Steps are serialised per worker, as torch's docstring promises (several
    trainers' optimizers over the same parameters): one lock for every
    instance in the process. torch's TorchScript optimizer takes none and
    relies on each update being one in-place op per parameter.
    """

    global_lock = threading.Lock()

    def __init__(self, functional_cls, local_params_rref, *args, **kwargs):
        self._local_params = [rref.local_value() for rref in local_params_rref]
        self.optim = functional_cls(self._local_params, *args, **kwargs)

    def step(self, autograd_ctx_id: int) -> None:
        all_local_grads = _autograd().get_gradients(autograd_ctx_id)
        grads = [all_local_grads.get(p) for p in self._local_params]  # None: no gradient, the param is skipped
        with _FunctionalLocalOptimizer.global_lock:
            self.optim.step(grads)


class _LocalOptimizer:
    """On an owner: a torch.optim optimizer; the context's gradients become ``.grad``, then ``step()``.

    One lock for every instance in the process, as torch: several trainers'
    optimizers over the same parameters must not interleave their
    ``.grad`` assignments and steps.
    """

    global_lock = threading.Lock()

    def __init__(self, optim_cls, local_params_rref, *args, **kwargs):
        self._local_params = [rref.local_value() for rref in local_params_rref]
        self.optim = optim_cls(self._local_params, *args, **kwargs)

    def step(self, autograd_ctx_id: int) -> None:
        all_local_grads = _autograd().get_gradients(autograd_ctx_id)
        with _LocalOptimizer.global_lock:
            for param, grad in all_local_grads.items():
                param.grad = grad
            self.optim.step()


def _new_local_optimizer(optim_cls, local_params_rref, *args, **kwargs) -> RRef:
    return RRef(_LocalOptimizer(optim_cls, local_params_rref, *args, **kwargs))


def _new_functional_local_optimizer(functional_cls, local_params_rref, *args, **kwargs) -> RRef:
    return RRef(_FunctionalLocalOptimizer(functional_cls, local_params_rref, *args, **kwargs))


def _local_optimizer_step(local_optim_rref: RRef, autograd_ctx_id: int) -> None:
    local_optim_rref.local_value().step(autograd_ctx_id)


def _wait_for_all(rpc_futs) -> list:
    """Every future's value; after all have finished, the last exception if any failed (torch's rule)."""
    exception = None
    results = []
    for fut in rpc_futs:
        try:
            results.append(fut.wait())
        except Exception as exc:
            results.append(exc)
            exception = exc
    if exception is not None:
        raise exception
    return results


def _check_context(context_id: int) -> None:
    """torch checks the id on the caller first: an unknown id is the caller's error, and no RPC is sent."""
    autograd = _autograd()
    is_valid = getattr(autograd, "_is_valid_context", None)
    if is_valid is not None:
        is_valid(context_id)
    else:  # same error for an unknown id ("Could not find autograd context with id: N")
        autograd.get_gradients(context_id)


class DistributedOptimizer:
    """An optimizer over parameters scattered across workers (torch.distributed.optim.DistributedOptimizer).

    Args: ``optimizer_class`` the torch.optim class built on every owner;
    ``params_rref`` RRefs to the parameters (local or remote); ``*args`` and
    ``**kwargs`` go to every owner's optimizer constructor.
    """

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        torch._C._log_api_usage_once("distconform.reference.rpc.DistributedOptimizer")
        per_worker_params_rref = defaultdict(list)
        for param in params_rref:
            per_worker_params_rref[param.owner()].append(param)

        # imported here, not with the module: torch.distributed.optim imports DTensor and sympy (1.8 s of CPU), which
        # every pytest-xdist worker of tests/ paid at collection for a module most of them never build an optimizer in
        from torch.distributed.optim.utils import functional_optim_map

        # torch's rule: exactly a mapped class (a subclass is not) and TorchScript enabled
        if optimizer_class in functional_optim_map and jit._state._enabled:
            optim_ctor = functional_optim_map[optimizer_class]
        else:
            optim_ctor = optimizer_class
        self.is_functional_optim = optim_ctor is not optimizer_class

        if self.is_functional_optim:
            new_local = _new_functional_local_optimizer
        else:
            logger.warning(  # torch's text (optimizer.py), so logs read the same on every agent
                "Creating the optimizer %s without TorchScript support, "
                "this might result in slow computation time in multithreading environment"
                "(i.e. Distributed Model Parallel training on CPU) due to the Python's "
                "Global Interpreter Lock (GIL). Please file an issue if you need this "
                "optimizer in TorchScript. ",
                optimizer_class,
            )
            new_local = _new_local_optimizer

        futs = [rpc.rpc_async(worker, new_local, args=(optim_ctor, param_rrefs) + args, kwargs=kwargs)
                for worker, param_rrefs in per_worker_params_rref.items()]
        self.remote_optimizers = _wait_for_all(futs)

    def step(self, context_id: int) -> None:
        """One optimisation step on every owner with the gradients of ``context_id``; blocks until all are done."""
        _check_context(context_id)
        futs = [rpc.rpc_async(optimizer.owner(), _local_optimizer_step, args=(optimizer, context_id))
                for optimizer in self.remote_optimizers]
        _wait_for_all(futs)
