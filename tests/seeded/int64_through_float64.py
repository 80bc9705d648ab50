"""Seeded bug: int64 all_reduce accumulates in float64, losing the low bits.

A backend that has only floating-point reduction kernels and casts integers
through double: anything above 2**53 is rounded. Caught by the all_reduce
contract (suites/c10d/test_all_reduce.py::test_all_reduce, int64 sum: the
inputs sit at 2**55 + small).
"""

import torch
import torch.distributed as dist

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register

ARITHMETIC = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)


class Int64ThroughFloat64(GlooWrapper):
    """all_reduce of int64 tensors is done on a float64 copy and cast back."""

    def allreduce(self, tensors, opts):
        if tensors[0].dtype != torch.int64 or not any(opts.reduceOp == op for op in ARITHMETIC):
            return super().allreduce(tensors, opts)
        wide = [t.to(torch.float64) for t in tensors]
        self.inner.allreduce(wide, opts).wait()
        for tensor, result in zip(tensors, wide):
            tensor.copy_(result.to(torch.int64))
        return completed_work(tensors)


DISTCONFORM_SPEC = register("int64_through_float64", Int64ThroughFloat64)
