"""The reference backend's own flight recorder (backends/reference/flight_recorder.py) in one process, and the hook
the harness reads it through (backends/flight_recorders.py, fixtures/flight_dump.py). The recorder in a live world
is checked by suites/c10d/test_flight_recorder.py (recorder=backend) and tests/test_hang_report.py."""

import pytest
import torch

from backends import flight_recorders
from backends.reference.flight_recorder import FlightRecorder, dtype_name
from fixtures import flight_dump


def named_group(recorder: FlightRecorder, name: str = "1", ranks=(0, 1)):
    group = recorder.group(list(ranks))
    recorder.named(group, name=name, desc="undefined")
    return group


def test_an_entry_goes_scheduled_started_completed_and_pg_status_follows():
    recorder = FlightRecorder(10)
    group = named_group(recorder)
    t = torch.ones(2, 3)
    entry = recorder.record(group, "all_reduce", 1, [t], [t], 1.5)
    dump = recorder.dump(pickled=False)
    assert dump["entries"][0]["state"] == "scheduled"
    assert dump["pg_status"]["1"] == {"last_enqueued_collective": "1", "last_started_collective": "-1",
                                      "last_completed_collective": "-1"}
    recorder.started(entry)
    recorder.completed(entry)
    dump = recorder.dump(pickled=False)
    (recorded,) = dump["entries"]
    assert recorded["state"] == "completed" and recorded["retired"] is True
    assert recorded["profiling_name"] == "reference:all_reduce"
    assert recorded["process_group"] == ["1", "undefined"]
    assert (recorded["input_sizes"], recorded["input_dtypes"], recorded["timeout_ms"]) == ([[2, 3]], ["Float"], 1500)
    assert dump["pg_status"]["1"] == {"last_enqueued_collective": "1", "last_started_collective": "1",
                                      "last_completed_collective": "1"}
    assert dump["pg_config"]["1"] == {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}


def test_pickled_form_is_torchs():
    """torch's pickled dump: process_group a tuple, pg_status numbers as ints, unset times None."""
    recorder = FlightRecorder(10)
    group = named_group(recorder)
    recorder.record(group, "barrier", 1, [], [], 1.0)
    dump = recorder.dump(pickled=True)
    (entry,) = dump["entries"]
    assert entry["process_group"] == ("1", "undefined")
    assert entry["time_discovered_started_ns"] is None and entry["time_discovered_completed_ns"] is None
    assert dump["pg_status"]["1"]["last_enqueued_collective"] == 1
    assert set(dump) >= {"version", "pg_config", "pg_status", "entries", "comm_lib_version"}


def test_p2p_calls_count_their_own_sequence_and_keep_the_groups_collective_one():
    recorder = FlightRecorder(10)
    group = named_group(recorder)
    t = torch.ones(5)
    recorder.record(group, "all_reduce", 1, [t], [t], 1.0)
    recorder.record(group, "send 0->1", 0, [t], [t], 1.0, p2p=True)
    recorder.record(group, "recv 0<-1", 0, [t], [t], 1.0, p2p=True)
    entries = recorder.dump(pickled=False)["entries"]
    assert [(e["collective_seq_id"], e["p2p_seq_id"], e["op_id"], e["is_p2p"]) for e in entries] == [
        (1, 0, 1, False), (1, 1, 2, True), (1, 2, 3, True)]
    assert [e["record_id"] for e in entries] == [0, 1, 2]


def test_the_ring_keeps_the_last_entries_and_size_0_records_nothing():
    recorder = FlightRecorder(2)
    group = named_group(recorder)
    for seq in range(1, 5):
        recorder.record(group, "barrier", seq, [], [], 1.0)
    assert [e["collective_seq_id"] for e in recorder.dump(pickled=False)["entries"]] == [3, 4]
    off = FlightRecorder(0)
    assert off.record(named_group(off), "barrier", 1, [], [], 1.0) is None
    assert off.dump(pickled=False)["entries"] == []


def test_a_recording_error_never_reaches_the_call():
    recorder = FlightRecorder(10)
    group = named_group(recorder)
    assert recorder.record(group, "all_reduce", 1, [object()], [], 1.0) is None  # no .shape: recording fails
    recorder.started(None)
    recorder.completed(None)
    dump = recorder.dump(pickled=False)
    assert dump["entries"] == [] and dump["recording_errors"] == 1


@pytest.mark.parametrize("dtype, name", [(torch.float32, "Float"), (torch.int64, "Long"), (torch.uint8, "Byte"),
                                         (torch.bfloat16, "BFloat16"), (torch.complex64, "ComplexFloat")])
def test_dtypes_are_spelled_as_torchs_dumps_spell_them(dtype, name):
    assert dtype_name(dtype) == name


def test_the_harness_reads_registered_recorders_beside_torchs(monkeypatch):
    monkeypatch.setattr(flight_recorders, "_REGISTERED", {})
    recorder = FlightRecorder(10)
    group = named_group(recorder, name="7")
    recorder.record(group, "barrier", 1, [], [], 1.0)
    flight_recorders.register(flight_recorders.RegisteredRecorder(
        "mine", lambda: recorder.dump(pickled=False), lambda: recorder.dump(pickled=True)))
    assert flight_dump.backend_recorders() == ["mine"]
    assert [e["profiling_name"] for e in flight_dump.recorded_json(flight_dump.BACKEND)["entries"]] == \
        ["reference:barrier"]
    assert flight_dump.recorded_pickle(flight_dump.BACKEND)["entries"][0]["process_group"] == ("7", "undefined")
    merged = flight_dump.recorded_json(flight_dump.ALL)
    assert merged["pg_config"]["7"]["ranks"] == "[0, 1]" and len(merged["entries"]) >= 1
    assert not any(e["profiling_name"].startswith("reference:")
                   for e in flight_dump.recorded_json(flight_dump.TORCH).get("entries", []))
    with pytest.raises(ValueError, match="not one of"):
        flight_dump.recorded_json("mine")
