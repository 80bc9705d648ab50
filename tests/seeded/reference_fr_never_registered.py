"""Seeded bug in the reference backend's own flight recorder: it records, but never registers where tools read it.

The reference records every call into a recorder of its own and registers it through backends/flight_recorders.py
when its first group asks for it; the harness's hang reports and the flight-recorder clauses' recorder=backend
cases read what is registered. Here each group withdraws the registration once it is made: every call is still
recorded, and nobody can read it (a hang report would show torch's recorder only, which a Python backend cannot
write). Before the spec named the recorder a backend keeps (``own_flight_recorder``), the recorder=backend cases
took a rank with no registration for a backend without a recorder of its own and skipped. Caught by the
flight-recorder clauses (suites/c10d/test_flight_recorder.py): the reference's spec names its recorder, so the
recorder=backend cases run and find nothing recorded for their calls.
"""

from backends import flight_recorders
from backends.reference import flight_recorder
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class RecorderNeverRegistered(ReferenceProcessGroup):
    """Records into its own flight recorder, then withdraws the recorder's registration."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        flight_recorders._REGISTERED.pop(flight_recorder.PREFIX, None)  # BUG: the recorder is nowhere to be read


DISTCONFORM_SPEC = register_reference("reference_fr_never_registered", RecorderNeverRegistered)
