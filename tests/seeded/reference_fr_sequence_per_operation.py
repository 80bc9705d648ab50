"""Seeded bug in the reference backend's own flight recorder: collective_seq_id counts each operation by itself.

The reference records into a recorder of its own (backends/reference/flight_recorder.py, registered through
backends/flight_recorders.py). Here the group numbers its recorder entries per operation instead of by its one
collective sequence: results are right and every call is recorded, but all_reduce, broadcast and all_gather on a
fresh group all say collective_seq_id 1, so the hang report and fr_trace would pair the wrong calls across ranks.
Caught by the flight-recorder contract read through the backend's own recorder
(suites/c10d/test_flight_recorder.py::test_collectives_recorded[...-backend]; the recorder=torch cases are the
reference's declared gap).
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class SequencePerOperation(ReferenceProcessGroup):
    """The flight recorder's collective_seq_id counts each operation name separately."""

    def _fr_record(self, name, seq, inputs, outputs, timeout_s, p2p=False):
        if not p2p:
            counts = self.__dict__.setdefault("_fr_counts", {})
            counts[name] = seq = counts.get(name, 0) + 1  # BUG: the group's one sequence is ignored
        return super()._fr_record(name, seq, inputs, outputs, timeout_s, p2p)


DISTCONFORM_SPEC = register_reference("reference_fr_sequence_per_operation", SequencePerOperation)
