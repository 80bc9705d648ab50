"""Seeded bug: the distributed backward takes leaf gradients with ``torch.autograd.grad``, never running AccumulateGrad.

The gradients are right, but a post hook on a leaf's AccumulateGrad node
never runs (the reference engine before it ran those nodes as torch's
distributed engine does): DDP's reducer, which hooks there, would leave
gradients un-averaged. Caught by the AccumulateGrad post-hook clause.
"""

import torch

from backends.reference.rpc.autograd import engine
from tests.seeded.autograd_base import plant


def _grad_only(original):
    def run_engine(context, outputs, seeds, leaf_nodes, recvs, retain):
        leaves = [node.variable for node in leaf_nodes]
        edges = [(record.msg_id, edge) for record in recvs for edge in record.edges()]
        inputs = leaves + [edge for _, edge in edges]
        if not inputs:
            return {}
        # BUG: captures at the leaves; their AccumulateGrad nodes (and hooks) never run
        grads = torch.autograd.grad(outputs, inputs, seeds, retain_graph=retain, allow_unused=True)
        for leaf, g in zip(leaves, grads):
            if g is not None:
                context.accumulate(leaf, g)
        recv_grads: dict = {}
        for (msg_id, _), g in zip(edges, grads[len(leaves):]):
            recv_grads.setdefault(msg_id, []).append(g)
        return recv_grads
    return run_engine


DISTCONFORM_SPEC = plant("autograd_accumulate_hooks_skipped", engine, "_run_engine", _grad_only)
