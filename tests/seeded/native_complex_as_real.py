"""Seeded bug in the native backend: complex tensors are reduced as their real view, whatever the op.

``makeReduction`` (native/collectives.cpp, planted bug ``complex_as_real``)
swaps a complex dtype for its real one, so the kernel reduces twice as many
floats: what torch's dist.all_reduce does for SUM and AVG (where it is right),
done for every op. PRODUCT multiplies real and imaginary parts separately and
MAX compares them instead of refusing. reduce and reduce_scatter_tensor, which
torch hands the backend as complex tensors, show it. Caught by
suites/c10d/test_dtypes.py::test_complex_reduce_and_reduce_scatter.
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_complex_as_real", "complex_as_real",
                                       "complex tensors reduced as their real view")
