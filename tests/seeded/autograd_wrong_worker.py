"""Seeded bug: a recv function sends its gradients to the context's creator instead of the worker that sent the message.

A plausible shortcut (every gradient "goes back to whoever started the
backward"): right for a single caller -> callee hop, wrong as soon as a
chain turns back (A -> B -> A: the gradients of B's nested request land on A,
addressed to a send function A does not have). Caught by the chain clauses.
"""

from backends.reference.rpc.autograd import engine
from backends.reference.rpc.autograd.container import ID_SHIFT
from tests.seeded.autograd_base import plant


def _to_creator(original):
    def propagate(self, record, grads):
        creator = self.context.id >> ID_SHIFT  # BUG: the context's creator, not record.src
        wrong = type(record)(record.msg_id, creator, record.node, record.shapes)
        return original(self, wrong, grads)
    return propagate


DISTCONFORM_SPEC = plant("autograd_wrong_worker", engine.BackwardPass, "_propagate", _to_creator)
