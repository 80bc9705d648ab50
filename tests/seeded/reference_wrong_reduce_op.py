"""Seeded bug in the reference backend: MIN and MAX swapped in the reduce-op table.

The op name is looked up wrong once, before the oracle's own reduction runs,
so every MIN reduction returns the maximum and vice versa. Caught by the
all_reduce matrix (every op on every dtype).
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class WrongReduceOp(ReferenceProcessGroup):
    """MIN is computed as MAX and MAX as MIN."""

    @staticmethod
    def _reduce_op(opts):
        op = ReferenceProcessGroup._reduce_op(opts)
        return {"min": "max", "max": "min"}.get(op, op)  # BUG


DISTCONFORM_SPEC = register_reference("reference_wrong_reduce_op", WrongReduceOp)
