"""Seeded bug in the reference backend: all_gather loses the last rank's chunk.

The gather loop stops one rank short, so the output entry of the highest
rank keeps whatever the caller put there. Caught by the all_gather clauses,
whose output buffers start with a value no rank sends.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class LostChunk(ReferenceProcessGroup):
    """all_gather never fills the last entry of the output list."""

    def allgather(self, output_lists, input_tensors, opts):
        outputs = output_lists[0]
        scratch = outputs[-1].clone()  # BUG: the last rank's chunk lands here, not in the caller's tensor
        return super().allgather([outputs[:-1] + [scratch]], input_tensors, opts)


DISTCONFORM_SPEC = register_reference("reference_lost_chunk", LostChunk)
