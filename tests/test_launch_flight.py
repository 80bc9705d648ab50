"""fixtures/launch/flight.py: a launched rank's flight-recorder dump over the control channel, without launching
anything. The supervisor's side reads what its rank wrote; the controller's side takes any bytes from the socket
and gives a dump or a one-line reason, never an exception (fuzzed, as tests/test_launch_channel.py does for the
handshake). The end-to-end hang of a launched world is tests/test_launch_nodes.py's."""

from __future__ import annotations

import json
import pickle
import secrets
import signal
import subprocess
import sys
import time

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fixtures.fr_trace_input import complete_pg_config
from fixtures.hang_report import analyse, dump_shape_problem
from fixtures.launch.flight import received, take_dump
from fixtures.launch.protocol import FlightDump
from tests.harness_cases.procs import REPO_ROOT


def _entry(record_id, seq, name="barrier"):
    return {"record_id": record_id, "collective_seq_id": seq, "profiling_name": f"gloo:{name}",
            "process_group": ["0", "default_pg"], "state": "scheduled", "is_p2p": False}


def _dump(rank, seqs, enqueued, completed):
    return {"entries": [_entry(i, s) for i, s in enumerate(seqs)], "pg_config": {},
            "pg_status": {"0": {"last_enqueued_collective": str(enqueued), "last_completed_collective": str(completed)}},
            "distconform": {"rank": rank, "recorder_size": 2000}}


def _answer(rank, dump, host="nodeA"):
    return FlightDump(1, rank, host, json.dumps(dump).encode(), pickle.dumps(dump))


# ------------------------------------------------------------ the controller's side
def test_a_good_answer_is_the_dump_and_its_bytes():
    dump = _dump(0, [1, 2], 2, 1)
    got = received(_answer(0, dump), 0, "nodeA")
    assert got.dump == dump and json.loads(got.json) == dump and pickle.loads(got.pickle) == dump


def test_every_bad_answer_is_a_reason_naming_the_host():
    good = _answer(1, _dump(1, [1], 1, 1))
    cases = [
        ("no answer from its supervisor within 8 s", "no answer from its supervisor within 8 s"),
        (b"raw bytes", "its supervisor sent a bytes instead of a FlightDump"),
        (FlightDump(1, 2, "nodeB", good.json, good.pickle), "its supervisor's answer names rank 2"),
        (FlightDump(1, 1, "nodeB", "text", b""), "the answer's json is a str, not bytes"),
        (FlightDump(1, 1, "nodeB", b"", b"", "the rank wrote no dump within 3 s of the signal"),
         "the rank wrote no dump within 3 s of the signal"),
        (FlightDump(1, 1, "nodeB", b"", b""), "its supervisor sent an empty dump without saying why"),
        (FlightDump(1, 1, "nodeB", good.json[:-7], b""), f"the {len(good.json) - 7} bytes sent are not JSON ("),
        (FlightDump(1, 1, "nodeB", b"[1, 2]", b""), "not in the shape fixtures/flight_dump.py writes: the dump is a "
                                                     "list, not an object"),
        (FlightDump(1, 1, "nodeB", b'{"entries": [3]}', b""), "entries[0] is a int, not an object"),
    ]
    for answer, why in cases:
        got = received(answer, 1, "nodeB")
        error = got.dump["distconform"]["error"]
        assert error.startswith("on host nodeB, ") and why in error, (answer, error)
        assert (got.json, got.pickle) == (b"", b"")
        line = analyse({1: got.dump}, 2).lines[1]
        assert line == f"rank 1: no flight-recorder dump: {error}", line


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=20)
_entry_like = st.fixed_dictionaries({}, optional={
    "record_id": _json, "collective_seq_id": _json, "profiling_name": _json, "state": _json, "is_p2p": _json,
    "process_group": st.lists(_json, max_size=3) | st.lists(_json, max_size=3).map(tuple) | _json})
_dump_like = st.fixed_dictionaries({}, optional={
    "entries": st.lists(_entry_like, max_size=4) | _json,
    "pg_status": st.dictionaries(st.sampled_from(["0", "1"]), st.dictionaries(
        st.sampled_from(["last_enqueued_collective", "last_completed_collective"]), _json)) | _json,
    "pg_config": st.dictionaries(st.sampled_from(["0", "1"]), st.dictionaries(
        st.sampled_from(["ranks", "desc"]), st.sampled_from(["[0, 1]", "[0, 'x']", "5", "[[1]]", "((", "[1e999]"])
        | _json)) | _json,
    "distconform": st.fixed_dictionaries({}, optional={"rank": _json, "recorder_size": _json, "error": _json}) | _json,
})


# What a supervisor (or anything on the socket) may have sent as the JSON: a dump-like value's JSON, cut anywhere,
# arbitrary bytes, or not bytes at all.
_payloads = st.one_of(_dump_like.map(lambda d: json.dumps(d).encode()),
                      st.tuples(_dump_like, st.integers(0, 400)).map(lambda t: json.dumps(t[0]).encode()[:t[1]]),
                      st.binary(max_size=64), _json)


@settings(max_examples=300, deadline=None)
@given(_payloads, st.integers(0, 2), st.binary(max_size=16),
       st.one_of(st.just(""), st.text(max_size=8), st.integers()))
@example(b'{"entries": [{"collective_seq_id": Infinity, "process_group": ["0", "default_pg"]}]}', 0, b"", "")
@example(b'{"pg_config": {"0": {"ranks": "[[1]]"}}, "entries": [{"process_group": ["0", "g"]}]}', 0, b"", "")
@example(b"[" * 5000, 0, b"", "")
def test_any_answer_is_a_dump_or_a_reason_and_the_report_reads_it(payload, rank, pickled, note):
    got = received(FlightDump(1, rank, "nodeB", payload, pickled, note), rank, "nodeB")
    assert isinstance(got.dump, dict)
    if not got.json:
        assert got.dump["distconform"]["error"].startswith("on host nodeB, ")
    else:
        assert dump_shape_problem(got.dump) == ""
    # what the hang report and the fr_trace copy do with it: never raise
    other = _dump(1 - rank % 2, [1, 2], 2, 1)
    dumps = {rank: got.dump, 3: other}
    report = analyse(dumps, 4)
    assert report.lines and all(isinstance(line, str) for line in report.lines)
    if got.json:
        complete_pg_config(json.loads(got.json), dumps, 4)


@settings(max_examples=200, deadline=None)
@given(_dump_like)
def test_a_dump_of_any_shape_is_analysed_or_named_unreadable(dump):
    report = analyse({0: dump, 1: _dump(1, [1], 1, 0)}, 2)
    problem = dump_shape_problem(dump)
    assert (f"rank 0: flight-recorder dump unreadable: {problem}" in report.lines) == bool(problem)
    if not problem:
        complete_pg_config(dump, {0: dump}, 2)


# ------------------------------------------------------------ over a real channel
def test_the_cluster_names_each_rank_without_a_dump_within_its_bound():
    """rank 0 answers a dump, rank 1 a cut-off one, rank 2 never answers, rank 3 sends garbage on the socket (its
    supervisor is taken for gone): one bounded wait, one reason each, the hang report reads them."""
    import threading

    from fixtures.launch.cluster import RemoteCluster
    from fixtures.launch.protocol import DumpFlightRecorder, Heartbeat, Join, dial
    from fixtures.protocol import recv, send

    key = secrets.token_bytes(32)
    cluster = RemoteCluster(4, key, "127.0.0.1")
    good = _dump(0, [1, 2], 2, 1)
    answers = {0: lambda q: send(watch[0], FlightDump(q.request_id, 0, "nodeA", json.dumps(good).encode(), b"")),
               1: lambda q: send(watch[1], FlightDump(q.request_id, 1, "nodeA", json.dumps(good).encode()[:40], b"")),
               2: lambda q: None,
               3: lambda q: watch[3].send_bytes(b"\x80\x05not a pickle")}
    watch = {}
    try:
        for rank in range(4):
            data, watch[rank] = dial(("127.0.0.1", cluster.port), key), dial(("127.0.0.1", cluster.port), key)
            send(data, Join(rank, "rank", "nodeA" if rank < 2 else "nodeB", 1, 0, 1, "torchrun"))
            send(watch[rank], Join(rank, "watchdog", "nodeA" if rank < 2 else "nodeB", 2, 0, 1, "torchrun"))

            def serve(rank=rank):
                try:
                    while True:
                        message = recv(watch[rank])
                        if isinstance(message, Heartbeat):
                            send(watch[rank], Heartbeat())
                        elif isinstance(message, DumpFlightRecorder):
                            answers[rank](message)
                except (EOFError, OSError):
                    return

            threading.Thread(target=serve, daemon=True).start()
        cluster.wait_joined(10)
        start = time.monotonic()
        came = cluster.flight_dumps(range(4), wait_s=2.0)
        assert time.monotonic() - start < 2.0 + 1.0
        dumps = {rank: received(answer, rank, cluster.links[rank].host).dump for rank, answer in came.items()}
        assert dumps[0] == good
        assert "on host nodeA, the 40 bytes sent are not JSON" in dumps[1]["distconform"]["error"]
        assert dumps[2]["distconform"]["error"] == "on host nodeB, no answer from its supervisor within 2 s"
        assert dumps[3]["distconform"]["error"] == "on host nodeB, its supervisor is gone"
        lines = analyse(dumps, 4).lines
        assert lines[:3] == ["rank 1: no flight-recorder dump: " + dumps[1]["distconform"]["error"],
                             "rank 2: no flight-recorder dump: on host nodeB, no answer from its supervisor within 2 s",
                             "rank 3: no flight-recorder dump: on host nodeB, its supervisor is gone"]
    finally:
        cluster.finish(0, wait_s=0.1)


# ------------------------------------------------------------ the supervisor's side
_RANK = """
import os, sys, time
os.environ["TORCH_FR_BUFFER_SIZE"] = "0"  # the recorder off: the dump needs no torch
from fixtures.flight_dump import arm
arm(sys.argv[1], 3)
print("armed", flush=True)
time.sleep(60)
"""


def test_the_supervisor_reads_what_its_rank_wrote_or_says_why_not(tmp_path):
    rank = subprocess.Popen([sys.executable, "-c", _RANK, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            text=True)
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
                             "print('deaf', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline() == "armed\n" and deaf.stdout.readline() == "deaf\n"
        (tmp_path / "rank3.fr.json").write_text("stale")  # a previous dump never stands in for this one
        data, pickled, note = take_dump(rank, str(tmp_path), 3)
        assert note == "" and pickled == b""
        assert json.loads(data) == {"distconform": {"rank": 3, "recorder_size": 0}}
        assert take_dump(deaf, str(tmp_path / "deaf"), 0, wait_s=0.3) == (
            b"", b"", "the rank wrote no dump within 0.3 s of the signal")
        deaf.send_signal(signal.SIGKILL)
        deaf.wait()
        assert take_dump(deaf, str(tmp_path), 0) == (b"", b"", "the rank process is gone (exit status -9)")
    finally:
        for proc in (rank, deaf):
            proc.kill()
            proc.wait()
