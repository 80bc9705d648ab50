"""Seeded bug: complex tensors are all-reduced as their real view, whatever the op.

What torch's dist.all_reduce does for SUM and AVG (where it is right),
done by the backend for every op: MIN and MAX then compare real and
imaginary parts separately and return a "minimum" that is no rank's value,
instead of refusing. Caught by
suites/c10d/test_dtypes.py::test_complex_all_reduce_unordered_op_raises
(and its PRODUCT, the product of the real view, by test_complex_group_all_reduce).
"""

import torch

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ComplexAsReal(GlooWrapper):
    """allreduce hands gloo the real view of a complex tensor for every reduce op."""

    def allreduce(self, tensors, opts=None):
        if not isinstance(tensors, torch.Tensor) and tensors and tensors[0].is_complex():
            tensors = [torch.view_as_real(t) for t in tensors]  # BUG: right for SUM/AVG only
        return super().allreduce(tensors, opts)


DISTCONFORM_SPEC = register("complex_reduced_as_real", ComplexAsReal)
