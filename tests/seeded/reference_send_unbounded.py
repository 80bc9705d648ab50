"""Seeded bug in the reference backend: a send waits for the peer's window without a deadline.

The mesh drops the deadline a frame is given, so a frame that does not fit into the connection (the peer reads
nothing: a silent partition) waits for the peer's window for good, and so does a collective sending it: what the
reference did before its sends were bounded. Caught by the fault clause that bounds every wait by its timeout plus
the slack (suites/faults/test_network_faults.py, all_reduce: each peer's share of its payload is more than the
connection holds). A p2p sender's wait() still ends (its Work times out), but its frame stays in the connection.
"""

from backends.reference.transport import Mesh
from tests.seeded.reference_base import register_reference, with_mesh


class UnboundedMesh(Mesh):
    def post(self, peer, kind, tag, meta, data, deadline, done):
        return super().post(peer, kind, tag, meta, data, None, done)  # BUG: the deadline is dropped


SendUnbounded = with_mesh(UnboundedMesh, "Sends wait for the peer's window without end.")


DISTCONFORM_SPEC = register_reference("reference_send_unbounded", SendUnbounded)
