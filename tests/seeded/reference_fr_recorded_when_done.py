"""Seeded bug in the reference backend's own flight recorder: a collective is recorded only once its Work ended.

The reference records into a recorder of its own (backends/reference/flight_recorder.py). Here a collective's entry
is held back when it is issued and added to the recorder when its Work completes or fails (a recorder that writes
whole records, times and all, at the end). After wait() every entry is there, completed, so every clause of
suites/c10d/test_flight_recorder.py still passes; but while a collective waits (a hang, a network fault) the recorder
holds nothing of it, and a hang report shows every rank done with the collectives before it.
Caught by suites/faults/test_fault_flight_recorder.py::test_the_recorder_shows_the_collective_each_rank_waits_in.
"""

from backends.reference.flight_recorder import recorder
from backends.reference.process_group import ReferenceWork
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class RecordedWhenDoneWork(ReferenceWork):
    # the whole record at the end: it appears as the Work left it (retired, counted in pg_status)
    def _record_completion(self) -> None:
        super()._record_completion()
        self._publish()

    def _record_failure(self) -> None:
        super()._record_failure()
        self._publish()

    def _publish(self) -> None:
        if self.fr_entry is not None and self.fr_entry not in recorder().entries:
            recorder().entries.append(self.fr_entry)


class RecordedWhenDone(ReferenceProcessGroup):
    """A collective's flight-recorder entry appears only once its Work ended."""

    work_class = RecordedWhenDoneWork

    def _fr_record(self, name, seq, inputs, outputs, timeout_s, p2p=False):
        entry = super()._fr_record(name, seq, inputs, outputs, timeout_s, p2p)
        if entry is not None and not p2p:
            recorder().entries.remove(entry)  # BUG: held back until its Work ends (RecordedWhenDoneWork._publish)
        return entry


DISTCONFORM_SPEC = register_reference("reference_fr_recorded_when_done", RecordedWhenDone)
