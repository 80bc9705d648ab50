"""Seeded bug: distributed backward accumulates leaf gradients into ``.grad`` instead of the context.

What a port that reuses the local engine unchanged does (AccumulateGrad
runs): ``.grad`` fills up, ``get_gradients(context_id)`` stays empty. Caught
by the first backward clause, which reads the context and checks that
``.grad`` is untouched.
"""

from backends.reference.rpc.autograd.container import DistAutogradContext
from tests.seeded.autograd_base import plant


def _into_grad(original):
    def accumulate(self, leaf, grad):
        grad = grad.detach()  # BUG: the leaf's .grad, not the context
        leaf.grad = grad.clone() if leaf.grad is None else leaf.grad + grad
    return accumulate


DISTCONFORM_SPEC = plant("autograd_grad_attribute", DistAutogradContext, "accumulate", _into_grad)
