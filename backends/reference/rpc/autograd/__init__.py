"""Distributed autograd for the reference RPC agents: torch.distributed.autograd's API, in Python.

``rpc_agents.autograd("reference-tp")`` is this module; it answers as
``torch.distributed.autograd`` does (same names, signatures, error texts)::

    with dist_autograd.context() as context_id:
        loss = rpc.rpc_sync("worker1", torch.mul, args=(t1, t2)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)  # {t1: t2, t2: t1}

FAST mode (PyTorch PR 27022): container.py (context ids, thread-local current
context), functions.py (send/recv functions as autograd nodes), engine.py
(the backward pass), service.py (what the agent calls: forward recording,
propagate-gradients / clean-up / RRef-backward requests), requests.py (the
requests a worker sends, below engine and service), messages.py (their
frames). Introspection as torch's: ``_current_context()``,
``_retrieve_context(id)`` give a ``DistAutogradContext`` with
``_context_id()``, ``_send_functions()``, ``_recv_functions()`` ({autograd
message id: node}, ids ascending) and ``_known_worker_ids()``.

Knowing differences from torch (the contract suite holds them as data):

* send/recv nodes are torch.autograd.Function nodes: ``.name()`` is
  "SendRpcBackward" / "RecvRpcBackward" (torch: "torch::distributed::autograd::
  ..."), and a recv node has one next function (an anchor leaf; torch: none);
* a backward whose context holds a send function that never receives
  gradients fails within the RPC timeout naming it (torch's FAST mode hangs);
* error texts carry no C++ backtrace; sparse gradients never cross the wire
  (the reference agents send strided tensors only).
"""

from __future__ import annotations

import torch

from .container import CONTAINER, DistAutogradContext
from . import engine as _engine
from . import service as _service

__all__ = ["context", "is_available"]

BACKWARD_RANGE = "torch::distributed::autograd::backward"  # the profiler range of a backward (torch's name)
_BACKWARD_SIGNATURE = ("backward(): incompatible function arguments. The following argument types are supported:\n"
                       "    1. (contextId: typing.SupportsInt, roots: collections.abc.Sequence[torch.Tensor], "
                       "retain_graph: bool = False) -> None\n\nInvoked with: {}")


def is_available() -> bool:
    return True


def _init(worker_id: int) -> None:
    CONTAINER.init(worker_id)


def _new_context() -> DistAutogradContext:
    return CONTAINER.new_context()


def _release_context(context_id: int) -> None:
    _service.release(context_id)


def _get_max_id() -> int:
    return CONTAINER.max_id()


def _is_valid_context(context_id: int) -> None:
    CONTAINER.retrieve(context_id)


def _retrieve_context(context_id: int) -> DistAutogradContext:
    return CONTAINER.retrieve(context_id)


def _current_context() -> DistAutogradContext:
    return CONTAINER.current()


def _get_debug_info() -> dict:
    contexts = CONTAINER.all()
    return {"num_autograd_contexts": len(contexts),
            "num_current_backward_passes": sum(c.backward is not None for c in contexts)}


class context:
    """``with context() as context_id``: a new distributed autograd context, released on exit everywhere."""

    def __enter__(self):
        self.autograd_context = _new_context()
        return self.autograd_context._context_id()

    def __exit__(self, type, value, traceback):
        _release_context(self.autograd_context._context_id())


def _parse_backward(args: tuple, kwargs: dict):
    """torch's pybind signature (contextId, roots, retain_graph=False), with its TypeError text."""
    names = ("contextId", "roots", "retain_graph")
    bound = dict(zip(names, args))
    bad = len(args) > 3 or any(k not in names or k in bound for k in kwargs)
    bound.update(kwargs)
    context_id, roots, retain = bound.get("contextId"), bound.get("roots"), bound.get("retain_graph", False)
    import torch

    if bad or isinstance(context_id, bool) or not isinstance(context_id, int) \
            or not isinstance(roots, (list, tuple)) or not all(isinstance(r, torch.Tensor) for r in roots) \
            or not isinstance(retain, bool):
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        raise TypeError(_BACKWARD_SIGNATURE.format(shown))
    return context_id, list(roots), retain


def backward(*args, **kwargs) -> None:
    """``backward(context_id, roots, retain_graph=False)``: the distributed backward pass from ``roots``.

    Returns when every worker's part is done; leaf gradients accumulate in the
    context of each worker (``get_gradients``), never in ``.grad``.
    """
    context_id, roots, retain_graph = _parse_backward(args, kwargs)
    agent = _service._agent()
    with torch.autograd.profiler.record_function(BACKWARD_RANGE):  # torch's RECORD_FUNCTION (dist_engine.cpp)
        running = _engine.start_backward(context_id, roots, retain_graph, agent)
        _engine.wait(running, agent.default_timeout)


def get_gradients(context_id: int) -> dict:
    """{leaf tensor of this worker: its gradient accumulated in context ``context_id``}."""
    found = CONTAINER.retrieve(context_id)
    with found.lock:
        return dict(found.grads)
