"""Seeded bug in the reference backend's p2p: a peer rank outside the group is looked for, not rejected.

What gloo does (its gap in backends/builtin.py): send/recv to rank world_size or -1 looks that rank's address up in
the store and waits for it until the group's timeout, then fails with the store's timeout. The reference checks the
peer against the group's size first. Caught by the clause that times the bad call against the group's timeout
(suites/p2p/test_p2p_errors.py::test_bad_peer_raises_promptly).
"""

from backends.reference.process_group import ReferenceProcessGroup
from tests.seeded.reference_base import register_reference


class BadPeerWaits(ReferenceProcessGroup):
    """send/recv to a rank outside the group waits in the store for that rank's address until the group's timeout."""

    def _check_peer(self, peer: int, what: str) -> None:
        if isinstance(peer, int) and not 0 <= peer < self.size():
            # BUG: looks the absent rank up as if it might still appear; the store's timeout error is what comes back
            self.store.wait([f"reference/bad_peer/address/{peer}"], self.timeout)
        super()._check_peer(peer, what)


DISTCONFORM_SPEC = register_reference("reference_bad_peer_waits", BadPeerWaits)
