"""Seeded bug: all_to_all_single lays out what it receives by the *input* split sizes.

The backend sizes the chunk it receives from rank i by what it sends to rank
i (``input_split_sizes[i]``) instead of what rank i sends to it
(``output_split_sizes[i]``): right whenever the split matrix is symmetric,
wrong (chunks at shifted offsets, or a size mismatch) whenever it is not.
Caught by an all_to_all_single clause whose uneven splits are asymmetric
(rank i sending to rank j a different amount than j sends to i).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class AllToAllSplitsSwapped(GlooWrapper):
    """all_to_all_single uses input_split_sizes for the receive side too."""

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        return super().alltoall_base(output, input, list(input_split_sizes), input_split_sizes, opts)


DISTCONFORM_SPEC = register("all_to_all_splits_swapped", AllToAllSplitsSwapped)
