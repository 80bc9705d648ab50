"""Seeded bug in the reference backend's send: isend writes the whole message on the caller's thread.

The reference's send used to do this: the frame went into the connection on the thread that called isend, bounded
by the group's timeout, and only then was the Work returned. On a connection nobody reads (a silent partition) the
caller is held until that timeout: 2 s in the fault scenario, days in reference-pg's agent group, where remote() and
to_here() never returned under a partition. Caught by the clause that times the sender's isend under a fault that
cuts the p2p (suites/faults/test_network_faults.py, --faults partition).
"""

import time

from backends.reference import wire
from backends.reference.flight_recorder import recorder
from backends.reference.process_group import ReferenceProcessGroup, ReferenceWork
from tests.seeded.reference_base import register_reference


class SendBlocksCaller(ReferenceProcessGroup):
    """isend writes the whole message into the connection before it returns its Work."""

    def _send(self, tensor, dst, tag) -> ReferenceWork:
        work = ReferenceWork(f"send to rank {dst} tag {tag}", self.timeout.total_seconds())
        work.fr_entry = self._fr_record(f"send {self.rank()}->{dst}", 0, [tensor], [tensor],
                                        self.timeout.total_seconds(), p2p=True)
        recorder().started(work.fr_entry)
        try:
            deadline = time.monotonic() + self.timeout.total_seconds()
            self.mesh.connect([dst], deadline)
            # BUG: waits for the bytes to be in the connection, on the caller's thread
            self.mesh.send(dst, wire.P2P, tag, wire.tensor_meta(tensor), wire.tensor_bytes(tensor), deadline=deadline)
            work.complete([tensor])
        except Exception as exc:
            work.fail(RuntimeError(f"reference: send to rank {dst} (tag {tag}) failed: {exc}"))
        return work


DISTCONFORM_SPEC = register_reference("reference_send_blocks_caller", SendBlocksCaller)
