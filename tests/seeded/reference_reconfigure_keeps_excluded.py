"""Seeded bug in the reference backend: a reconfigure to fewer ranks keeps the group it had, excluded ranks included.

reconfigure() checks the request (a fresh uuid, this rank's handle listed) and returns a completed Work, but
when the list names fewer ranks than the group has it keeps the current communicator: the survivors still
count the rank that was left out, so their all_reduce waits for it. Caught by
suites/c10d/test_reconfigure.py::test_survivors_are_renumbered (through the harness deadline: the rank left
out never joins).
"""

from backends.reference import fault_tolerance
from backends.reference.process_group import ReferenceWork
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class ReconfigureKeepsExcluded(ReferenceProcessGroup):
    """reconfigure() to a subset of the group's ranks keeps the whole group."""

    def reconfigure(self, opts):
        place = fault_tolerance.membership(opts.uuid, opts.handles, self._handle, self._used_uuids)
        if self._mesh is not None and place.size < self.size():  # BUG: the excluded ranks stay members
            self._used_uuids.add(opts.uuid)
            work = ReferenceWork(f"reconfigure (uuid {opts.uuid})", self.timeout.total_seconds())
            work.complete([])
            return work
        return super().reconfigure(opts)


DISTCONFORM_SPEC = register_reference("reference_reconfigure_keeps_excluded", ReconfigureKeepsExcluded)
