"""Seeded bug: all_reduce AVG is computed as SUM (the division by world size is forgotten).

The classic way to add AVG to a backend that only has SUM. Caught by the
all_reduce contract (suites/c10d/test_all_reduce.py::test_all_reduce, the
float avg cases).
"""

import torch.distributed as dist

from tests.seeded.gloo_wrapper import GlooWrapper, register


class AvgAsSum(GlooWrapper):
    """all_reduce with ReduceOp.AVG sums and never divides by the world size."""

    def allreduce(self, tensors, opts):
        if opts.reduceOp == dist.ReduceOp.AVG:
            opts.reduceOp = dist.ReduceOp.SUM
        return super().allreduce(tensors, opts)


DISTCONFORM_SPEC = register("avg_as_sum", AvgAsSum)
