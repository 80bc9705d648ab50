"""Seeded bug in the reference backend: a reconfigure after a timeout rebuilds the group it had, the cut-off rank included.

reconfigure() checks the request (a fresh uuid, this rank's handle listed) but, once a collective of the group
timed out, places this rank where it was (same rank, same size) instead of where the handles say: a recovery
that reconnects the old members. A reconfigure of the same members after a timeout still works
(suites/c10d/test_fault_signals.py passes), but the reachable ranks that try to continue without a partitioned
rank wait for it in the new communicator's rendezvous until the reconfigure's timeout. Caught by
suites/faults/test_partition_recovery.py::test_the_reachable_ranks_reconfigure_without_the_cut_rank.
"""

from backends.reference import fault_tolerance
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class ShrinkAfterTimeoutKeepsCutRank(ReferenceProcessGroup):
    """reconfigure() after a timeout keeps every member the group had."""

    def _place(self, opts) -> fault_tolerance.Membership:
        place = super()._place(opts)
        if self._unusable is not None:  # BUG: a timed-out group is rebuilt as it was, whatever the handles name
            return fault_tolerance.Membership(self._rank, self._size)
        return place


DISTCONFORM_SPEC = register_reference("reference_shrink_after_timeout_keeps_cut_rank", ShrinkAfterTimeoutKeepsCutRank)
