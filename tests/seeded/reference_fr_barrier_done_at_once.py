"""Seeded bug in the reference backend's own flight recorder: a barrier is recorded completed as soon as it is issued.

The reference records into a recorder of its own (backends/reference/flight_recorder.py). Here a barrier's entry is
marked completed when it is recorded (a plausible shortcut: a barrier moves no data, so a recorder that tracks
transfers calls it done at once). After wait() every entry is completed anyway, so every clause of
suites/c10d/test_flight_recorder.py still passes, and so does every all_reduce case of the fault clauses; but while a
barrier waits across a network fault its entry says "completed", and a hang report shows every rank past it.
Caught by suites/faults/test_fault_flight_recorder.py::test_the_recorder_shows_the_collective_each_rank_waits_in
(the barrier's cases) and test_the_failed_collective_is_never_recorded_completed.
"""

from backends.reference.flight_recorder import recorder
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class BarrierDoneAtOnce(ReferenceProcessGroup):
    """A barrier's flight-recorder entry is completed when it is recorded."""

    def _fr_record(self, name, seq, inputs, outputs, timeout_s, p2p=False):
        entry = super()._fr_record(name, seq, inputs, outputs, timeout_s, p2p)
        if name == "barrier":
            recorder().completed(entry)  # BUG: no data to wait for, so "done" before any peer arrived
        return entry


DISTCONFORM_SPEC = register_reference("reference_fr_barrier_done_at_once", BarrierDoneAtOnce)
