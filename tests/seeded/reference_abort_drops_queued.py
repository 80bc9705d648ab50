"""Seeded bug in the reference backend: abort() fails the running collective but drops the queued ones.

The group runs its collectives one at a time on a worker thread; abort()
empties the worker's queue before shutting down, so only the collective
already running fails, and every Work queued behind it is never completed:
a wait() on it times out. One pending Work (test_abort_fails_pending_work)
does not show it; many in flight on several groups do
(suites/c10d/test_lifecycle.py::test_abort_under_load_ends_every_pending_work).
"""

import queue

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class AbortDropsQueued(ReferenceProcessGroup):
    """abort() fails the running collective only; the queued ones never complete."""

    def abort(self):
        while True:  # BUG: the queued jobs are thrown away with their Works still pending
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        self.shutdown()


DISTCONFORM_SPEC = register_reference("reference_abort_drops_queued", AbortDropsQueued)
