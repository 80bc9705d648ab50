"""Seeded bug: all_reduce ignores the requested reduce op and always sums.

A backend whose kernel table only ever got the SUM entry wired up. Caught by
the all_reduce contract (suites/c10d/test_all_reduce.py::test_all_reduce):
every op other than sum comes out as a sum.
"""

import torch.distributed as dist

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ReduceOpIgnored(GlooWrapper):
    """all_reduce always reduces with SUM, whatever op was asked for."""

    def allreduce(self, tensors, opts):
        opts.reduceOp = dist.ReduceOp.SUM
        return super().allreduce(tensors, opts)


DISTCONFORM_SPEC = register("reduce_op_ignored", ReduceOpIgnored)
