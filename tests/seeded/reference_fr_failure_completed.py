"""Seeded bug in the reference backend's own flight recorder: a collective that failed is recorded completed.

The reference records into a recorder of its own (backends/reference/flight_recorder.py). Here a Work that ended with
an error (a timeout, a lost peer) marks its entry "completed", as one that succeeded does: what the reference did
before the fault clauses read its recorder (torch's recorders keep such an entry in the state its events reached:
NCCL's "started", gloo's "scheduled"). Results are right and every call is recorded, and every clause of
suites/c10d/test_flight_recorder.py still passes (they read completed calls), but a recorder read after a network
fault says the all_reduce every rank failed in completed.
Caught by suites/faults/test_fault_flight_recorder.py::test_the_failed_collective_is_never_recorded_completed.
"""

from backends.reference.process_group import ReferenceWork
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class FailureCompletedWork(ReferenceWork):
    def _record_failure(self) -> None:
        self._record_completion()  # BUG: a failed collective is recorded as one that completed


class FailureRecordedCompleted(ReferenceProcessGroup):
    """A collective that raised is recorded completed."""

    work_class = FailureCompletedWork


DISTCONFORM_SPEC = register_reference("reference_fr_failure_completed", FailureRecordedCompleted)
