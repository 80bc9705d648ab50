"""Seeded bug: broadcast always sends from rank 0, whatever ``src`` says.

A backend that hard-codes the root (or reads it from the wrong options
field). Indistinguishable from a correct one while every test broadcasts from
rank 0. Caught by the broadcast contract
(suites/c10d/test_broadcast_reduce.py::test_broadcast_from_every_root, root 1).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class BroadcastWrongRoot(GlooWrapper):
    """broadcast ignores the root rank and always broadcasts rank 0's tensor."""

    def broadcast(self, tensors, opts):
        opts.rootRank = 0
        return super().broadcast(tensors, opts)


DISTCONFORM_SPEC = register("broadcast_wrong_root", BroadcastWrongRoot)
