"""Seeded bug in the reference backend: isend/irecv between start and end coalescing are left out of the Work.

``_end_coalescing`` answers with a Work of the collectives issued since ``_start_coalescing`` only, so a coalesced
batch of sends and receives (``_coalescing_manager(device=...)``; torch's batch_isend_irecv for a backend that
advertises supports_coalescing) is "done" before its messages landed and the caller reads receive buffers still
untouched: the hole the reference had until its c10d Backend form took that path (2026-12-03). Caught by
suites/c10d/test_coalescing.py::test_coalescing_manager_with_device_p2p.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class CoalescedP2PLeftOut(ReferenceProcessGroup):
    """A p2p Work never joins the coalesced Work."""

    def _send(self, tensor, dst, tag):
        coalesced, self._coalesced = self._coalesced, None  # BUG: the send is not counted
        try:
            return super()._send(tensor, dst, tag)
        finally:
            self._coalesced = coalesced

    def _post_recv(self, tensor, src, tag):
        coalesced, self._coalesced = self._coalesced, None  # BUG: nor the receive
        try:
            return super()._post_recv(tensor, src, tag)
        finally:
            self._coalesced = coalesced


DISTCONFORM_SPEC = register_reference("reference_coalesced_p2p_left_out", CoalescedP2PLeftOut)
