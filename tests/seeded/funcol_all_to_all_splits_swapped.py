"""Seeded bug (the one in all_to_all_splits_swapped.py) seen through functional collectives.

all_to_all_single sizes what it receives from rank i by what it sends to
rank i. funcol.all_to_all_single and its backward (the reverse all_to_all)
reach the same entry point. Caught by suites/parallel:
test_funcol_all_to_all_single[uneven] and test_funcol_backward[all_to_all].
"""

from tests.seeded.all_to_all_splits_swapped import AllToAllSplitsSwapped
from tests.seeded.gloo_wrapper import register


class FuncolAllToAllSplitsSwapped(AllToAllSplitsSwapped):
    """all_to_all_single uses input_split_sizes for the receive side too."""


DISTCONFORM_SPEC = register("funcol_all_to_all_splits_swapped", FuncolAllToAllSplitsSwapped)
