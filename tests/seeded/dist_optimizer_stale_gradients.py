"""Seeded bug: the reference DistributedOptimizer steps every parameter with its first gradient forever.

The owners' view of distributed autograd keeps, per parameter, the gradient
of the first context that had one and answers it for every later context
(a cache that is never invalidated). The first step is right; training drifts
from step 2, on both the functional and the non-functional path. Caught by
the two-owner training clause: the weights after N steps must equal local
training on the same data.
"""

import threading

from backends.reference.rpc import optim as reference_optim
from tests.seeded.training_base import needs_reference_autograd, plant


needs_reference_autograd("dist_optimizer_stale_gradients")


class _StaleAutograd:
    """The reference autograd module, except that get_gradients answers each parameter's first gradient."""

    def __init__(self, autograd):
        self._autograd = autograd
        self._first: dict = {}  # parameter -> its first gradient (tensors hash by identity)
        self._lock = threading.Lock()

    def get_gradients(self, context_id):
        fresh = self._autograd.get_gradients(context_id)
        with self._lock:  # BUG: the cache is never invalidated
            return {p: self._first.setdefault(p, g.clone()) for p, g in fresh.items()}

    def __getattr__(self, name):
        return getattr(self._autograd, name)


def _stale(original):
    wrapped = {}

    def _autograd():
        module = original()
        if wrapped.get("module") is not module:
            wrapped["module"], wrapped["stale"] = module, _StaleAutograd(module)
        return wrapped["stale"]
    return _autograd


DISTCONFORM_SPEC = plant("dist_optimizer_stale_gradients", reference_optim, "_autograd", _stale)
