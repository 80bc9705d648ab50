"""Seeded bug in the reference backend: shutting a group down leaves its connections open.

shutdown() (which destroy_process_group calls) stops the group's worker but
never closes its mesh: the listening socket, one connection per peer and a
reader thread per connection stay behind for every destroyed group, and a
Work still pending on it is never failed. Caught by suites/c10d/test_lifecycle.py:
test_abort_fails_pending_work (first, with -x) and
test_destroyed_subgroups_leave_nothing_behind / test_reinit_leaves_nothing_behind
(the leftovers, measured in /proc).
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class ShutdownLeaks(ReferenceProcessGroup):
    """shutdown() stops the worker thread only."""

    def shutdown(self):
        self._jobs.put(None)  # BUG: self.mesh.close() is missing


DISTCONFORM_SPEC = register_reference("reference_shutdown_leaks", ShutdownLeaks)
