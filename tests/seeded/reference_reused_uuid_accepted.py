"""Seeded bug in the reference backend: reconfigure() forgets the uuids it used, so a reused uuid is accepted.

torch 2.14 requires a fresh uuid per reconfigure (gloo: "Gloo reconfigure uuid N was already used; each
reconfigure() requires a unique uuid"); this group accepts one it used before. Caught by
suites/c10d/test_reconfigure.py::test_bad_requests_are_refused.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class ReusedUuidAccepted(ReferenceProcessGroup):
    """reconfigure() accepts a uuid it used before."""

    def reconfigure(self, opts):
        self._used_uuids.clear()  # BUG: no memory of the uuids used
        return super().reconfigure(opts)


DISTCONFORM_SPEC = register_reference("reference_reused_uuid_accepted", ReusedUuidAccepted)
