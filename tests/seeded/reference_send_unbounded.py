"""Seeded bug in the reference backend: a send waits for the peer's window without a deadline.

The mesh's send drops the deadline it is given, so a send that does not fit into the connection (the peer reads
nothing: a silent partition) blocks in sendall for good: what the reference did before its sends were bounded.
Caught by the fault clause that bounds every wait by its timeout plus the slack
(suites/faults/test_network_faults.py, p2p).
"""

from backends.reference.transport import Mesh
from tests.seeded.reference_base import register_reference, with_mesh


class UnboundedMesh(Mesh):
    def send(self, peer, kind, tag, meta, data=b"", deadline=None):
        return super().send(peer, kind, tag, meta, data)  # BUG: the deadline is dropped


SendUnbounded = with_mesh(UnboundedMesh, "Sends wait for the peer's window without end.")


DISTCONFORM_SPEC = register_reference("reference_send_unbounded", SendUnbounded)
