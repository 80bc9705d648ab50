"""Seeded bug in the reference backend: sparse all_reduce drops the imaginary parts of complex values.

A sparse path written for real dtypes: the values travel as their real parts
and the sum is cast back, so a complex COO tensor comes back with the right
indices and real parts and zero imaginary parts. Dense complex tensors and
real sparse ones are untouched, so only the complex sparse clause sees it:
suites/c10d/test_dtypes.py::test_sparse_complex_group_all_reduce_sum.
"""

import torch

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class SparseComplexAsReal(ReferenceProcessGroup):
    """Complex sparse values are summed as their real parts."""

    def _sparse_allreduce(self, tensor, op, opts):
        if not tensor.is_complex():
            return super()._sparse_allreduce(tensor, op, opts)
        mine = tensor.detach().coalesce()
        real = torch.sparse_coo_tensor(mine.indices(), mine.values().real, tensor.shape)  # BUG: .imag is lost
        work = super()._sparse_allreduce(real, op, opts)
        work.wait()
        tensor.copy_(real.to(tensor.dtype))
        return work


DISTCONFORM_SPEC = register_reference("reference_sparse_complex_as_real", SparseComplexAsReal)
