"""Seeded bug in the reference backend: ending a group first completes its connections, without a deadline.

shutdown() (what destroy_process_group and the group's abort call) connects every pair the group has not connected
yet before closing, waiting for its peers an hour: a teardown that finishes a lazy rendezvous first. A lazily
connected group whose first collective failed under a fault never connected the cut-off rank, so the reachable
ranks' destroy_process_group waits for a peer that never dials. Caught by the clause that bounds ending the group
after its first collective failed (suites/faults/test_network_faults.py, --faults all).
"""

import time

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference

AN_HOUR_S = 3600.0


class ShutdownCompletesTheMesh(ReferenceProcessGroup):
    """Ending a group first connects every pair it has not connected yet, waiting an hour for them."""

    def shutdown(self):
        if self._mesh is not None:
            try:
                self._mesh.connect(range(self.size()), time.monotonic() + AN_HOUR_S)  # BUG: no deadline
            except Exception:
                pass
        super().shutdown()


DISTCONFORM_SPEC = register_reference("reference_shutdown_completes_the_mesh", ShutdownCompletesTheMesh)
