"""Seeded bug: backward ignores ``retain_graph=True`` and frees every worker's graph after each pass.

A second pass through anything that saved tensors then fails with "Trying
to backward through the graph a second time" instead of accumulating.
Caught by the retain_graph clause (three retained passes: 1x, 2x, 3x).
"""

from backends.reference.rpc.autograd import engine
from tests.seeded.autograd_base import plant


def _never_retain(original):
    def init(self, context, roots, retain_graph, agent):
        original(self, context, roots, False, agent)  # BUG: the caller's retain_graph is dropped
    return init


DISTCONFORM_SPEC = plant("autograd_retain_ignored", engine.BackwardPass, "__init__", _never_retain)
