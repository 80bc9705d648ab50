"""Seeded bug: all_to_all_single ignores uneven split sizes and splits evenly.

A backend that only implemented the even case and drops
``input_split_sizes``/``output_split_sizes``; with uneven splits the chunks
land at the wrong offsets (or the call is refused for sizes that do not
divide). Caught by the all_to_all contract
(suites/c10d/test_all_to_all.py::test_all_to_all_single, uneven splits).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class AllToAllSplitsIgnored(GlooWrapper):
    """all_to_all_single always splits evenly, whatever split sizes were given."""

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        return super().alltoall_base(output, input, [], [], opts)


DISTCONFORM_SPEC = register("all_to_all_splits_ignored", AllToAllSplitsIgnored)
