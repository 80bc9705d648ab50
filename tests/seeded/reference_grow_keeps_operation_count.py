"""Seeded bug in the reference backend: a group that grows keeps counting its operations from where it was.

When a reconfigure adds ranks to a communicator that has peers and this rank keeps its number (a grow in
place, as the reachable ranks' group grows back once a partitioned rank returns), the new communicator
inherits the old one's operation count instead of starting from zero. The ranks that were already members
then number their next collective after the ones they ran without the newcomer, the newcomer from zero, and
nobody's frames match: the grown group's first all_reduce times out on every rank. Every reconfigure of the
c10d clauses keeps the size, renumbers the ranks or grows from a rank alone, so they pass; caught by
suites/faults/test_partition_recovery.py::test_after_healing_the_whole_world_grows_back_by_reconfigure at
world size 3 (at 2 the reachable rank is alone, with no peers).
"""

from backends.reference import fault_tolerance
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class GrowKeepsOperationCount(ReferenceProcessGroup):
    """reconfigure() to more ranks, this one keeping its number, keeps the operation count."""

    def reconfigure(self, opts):
        place = fault_tolerance.membership(opts.uuid, opts.handles, self._handle, self._used_uuids)
        grows_in_place = (self._mesh is not None and self._unusable is None and self.size() > 1
                          and place.size > self.size() and place.rank == self.rank())
        count = self._seq
        work = super().reconfigure(opts)
        if grows_in_place:
            self._seq = count  # BUG: stale state of the communicator the group had
        return work


DISTCONFORM_SPEC = register_reference("reference_grow_keeps_operation_count", GrowKeepsOperationCount)
