"""Seeded bug: reduce always delivers the result to rank 0, whatever ``dst`` says.

The root rank is read from the wrong field, so every reduce lands on rank 0.
Indistinguishable from a correct backend while every test reduces to rank 0.
Caught by the reduce clause, which reduces to every root in turn.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ReduceToRankZero(GlooWrapper):
    """reduce ignores the root and reduces to rank 0."""

    def reduce(self, tensors, opts):
        opts.rootRank = 0  # BUG
        return super().reduce(tensors, opts)


DISTCONFORM_SPEC = register("reduce_to_rank_zero", ReduceToRankZero)
