"""Seeded bug in the reference backend: PREMUL_SUM is reduced as a plain SUM (the factor is dropped).

What a backend that maps every reduce op it does not know to SUM does: the
call succeeds and the result is off by the factor. Caught by
suites/c10d/test_dtypes.py::test_premul_sum.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class PremulAsSum(ReferenceProcessGroup):
    """ReduceOp.PREMUL_SUM is treated as ReduceOp.SUM."""

    @staticmethod
    def _reduce_op(opts):
        op = ReferenceProcessGroup._reduce_op(opts)
        return "sum" if op == "premul_sum" else op  # BUG

    @staticmethod
    def _premul_factor(opts):
        return None  # BUG (with the above): the factor is never read


DISTCONFORM_SPEC = register_reference("reference_premul_as_sum", PremulAsSum)
