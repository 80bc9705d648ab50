"""Seeded bug in the reference backend: a reconfigure to fewer ranks after a fault keeps every survivor's old number.

reconfigure() checks the request (a fresh uuid, this rank's handle listed) but, once a fault has revoked the group
(a timeout or a peer's reset: get_error() is not SUCCESS) and the handles name fewer ranks than it had, places
this rank at the number it had instead of its position in the list, as if the ranks cut off were always the last
ones. Where they are, the survivors' numbers are right and nothing shows; a shrink without fault renumbers
correctly (suites/c10d/test_reconfigure.py::test_survivors_are_renumbered passes), and so does a reconfigure of the
same members after a timeout (suites/c10d/test_fault_signals.py). Once a middle rank is cut off, a survivor after it
claims a number the smaller group does not have and its peers wait for the rank they miss until the reconfigure's
timeout. Caught by suites/faults/test_partition_recovery.py::test_the_reachable_ranks_reconfigure_without_the_cut_rank
in its middle-rank cases only (world size 3 and up).
"""

from backends.reference import fault_tolerance
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class ShrinkAfterFaultKeepsNumbers(ReferenceProcessGroup):
    """reconfigure() to fewer ranks after a fault keeps this rank's old number."""

    def _place(self, opts) -> fault_tolerance.Membership:
        place = super()._place(opts)
        if self._faults.error != "SUCCESS" and place.size < self.size():  # BUG: the survivors are not renumbered
            return fault_tolerance.Membership(self.rank(), place.size)
        return place


DISTCONFORM_SPEC = register_reference("reference_shrink_after_fault_keeps_numbers", ShrinkAfterFaultKeepsNumbers)
