"""The reference RPC transports, driven directly: PgTransport (frames over the c10d
backend under test) and FaultyTransport (fault injection), without an agent.

Contract: every frame sent arrives once, intact (every dtype, shape and
layout), in send order per sender thread and destination, from many threads
at once, over gloo and over the project's reference backend; shutdown never
hangs, even with the listener blocked in a receive from any source or with
peers that keep running; a peer that left is named in the error; fault
injection fails and delays exactly what torch's faulty agent does.
"""

from __future__ import annotations

import multiprocessing
import pickle
import struct
import threading
import time

import pytest
import torch

from backends.reference.rpc import pg_codec, pg_transport
from backends.reference.rpc.faulty import FaultyTransport, IntentionalFailure
from backends.reference.rpc.pg_codec import ProtocolError
from backends.reference.rpc.pg_transport import PgTransport
from backends.reference.rpc.transport import Frame, Kind, Transport, TransportError
from backends.registry import BackendRegistry
from backends.rpc_agents import FAULTABLE_KINDS, Faults
from fixtures.pool import WorldPool
from tests.rpc_cases import peer_loss
from tests.rpc_cases import transport_fns as fns

pytestmark = pytest.mark.timeout(120)

WORLDS = [("gloo", 2), ("gloo", 4), ("reference", 2), ("reference", 4)]


@pytest.fixture(scope="module")
def pool():
    pool = WorldPool(BackendRegistry(), deadline=30.0, max_alive=1)
    yield pool
    pool.close_all()


@pytest.fixture(scope="module", params=WORLDS, ids=[f"{b}-ws{n}" for b, n in WORLDS])
def tworld(request, pool):
    """A live world per (backend, world size); module scope groups the cases by world."""
    backend, world_size = request.param
    return pool.get(backend, world_size)


def assert_only_shutdowns(lost):
    """on_peer_lost during the shutdown race may only say that the peer closed first."""
    assert all(reason == f"rank {peer} has shut down its RPC transport" for peer, reason in lost), lost


# --------------------------------------------------------------- over live worlds
def test_all_to_all_from_16_threads_arrives_once_in_order(tworld):
    """Frames from 16 threads per rank to every peer all arrive, once, in each thread's send order."""
    threads, per_thread = 16, 8
    results = tworld.run(fns.all_to_all_threads, threads, per_thread)
    ws = tworld.world_size
    for rank, result in enumerate(results):
        assert result["errors"] == [] and result["bad"] == []
        assert_only_shutdowns(result["lost"])
        assert sorted(result["received"]) == [p for p in range(ws) if p != rank]
        for src, seen in result["received"].items():
            assert sorted(seen) == [(t, s) for t in range(threads) for s in range(per_thread)], \
                f"rank {rank} from {src}: lost or duplicated frames"
            for thread in range(threads):
                order = [s for t, s in seen if t == thread]
                assert order == list(range(per_thread)), f"rank {rank} got thread {thread} of rank {src} as {order}"


def _burst_results(tworld, planted: bool = False, send_window=None):
    return tworld.run(fns.burst_mixed, 400, 50, planted, send_window)


def test_burst_shares_metas_and_keeps_order_around_large_frames(tworld):
    """A burst of small frames to one peer leaves in batch metas (fewer c10d messages than frames)
    while every frame, the large ones that travel alone included, arrives once and in send order."""
    frames = 400
    results = _burst_results(tworld)
    for rank, result in enumerate(results):
        assert result["bad"] == [] and result["frames"] == frames * (tworld.world_size - 1)
        assert_only_shutdowns(result["lost"])
        for src, order in result["order"].items():
            assert order == list(range(frames)), f"rank {rank} got rank {src}'s frames out of order"
        # every frame alone would be one meta per frame (counted before the STOPs); how many share one
        # depends on how fast the backend completes a send (gloo: when the receiver takes it)
        assert result["metas"] < result["frames"], result


def test_huge_send_window_sends_every_frame_in_a_meta_of_its_own(tworld):
    """send_window beyond any burst turns batching off: one meta per frame (counted before the STOPs)."""
    for rank, result in enumerate(_burst_results(tworld, send_window=10**9)):
        peers = tworld.world_size - 1
        assert result["bad"] == [] and result["frames"] == 400 * peers
        assert result["metas"] == result["frames"], (rank, result["metas"])


def test_burst_order_check_catches_a_transport_that_reverses_its_batches(tworld):
    """The clause above can fail: with a planted transport that reverses each batch, some rank gets
    a peer's frames out of send order."""
    results = _burst_results(tworld, planted=True)
    assert any(order != sorted(order) for result in results for order in result["order"].values())


def test_payloads_of_every_dtype_and_layout_arrive_intact(tworld):
    """Every dtype (bool, bfloat16, complex, float8, unsigned), 0-dim, empty, strided, conjugated and
    16 MiB tensors arrive bit-identical, with the strides torch's RPC gives them (a transpose stays transposed),
    alone and bundled in one frame; header-only frames too."""
    results = tworld.run(fns.send_payloads)
    n_cases = len(fns.payload_cases())
    for result in results:
        assert result["wrong"] == []
        assert result["count"] == (n_cases + 3) * (tworld.world_size - 1)


def test_idle_shutdown_with_listener_blocked_returns_promptly(tworld):
    """Shutting down with the listener blocked in a receive from any source returns in bounded time,
    closes cleanly (every STOP exchanged); a peer that closed first is reported only as shut down."""
    results = tworld.run(fns.idle_shutdown)
    for rank, result in enumerate(results):
        assert result["elapsed"] < 5.0, result
        assert result["clean"] and not result["state"]["listener_alive"] and result["state"]["group_destroyed"]
        assert result["state"]["stop_received"] == [p for p in range(tworld.world_size) if p != rank]
        assert_only_shutdowns(result["lost"])


def test_rank_leaving_early_is_named_and_does_not_block_anyone(tworld):
    """A rank that shuts down while its peers keep running returns promptly; the peers are told through
    on_peer_lost, a send to it raises TransportError naming it, the others keep talking."""
    results = tworld.run(fns.one_rank_leaves_early)
    assert results[0]["elapsed"] < 5.0 and results[0]["clean"]
    assert "cannot send to rank 1" in results[0]["send_after"]
    for rank, result in enumerate(results[1:], start=1):
        assert result["lost"] == [(0, "rank 0 has shut down its RPC transport")]
        assert result["send_to_0"].startswith("reference-pg: cannot send to rank 0: rank 0 has shut down")
        assert result["from"] == [p for p in range(1, tworld.world_size) if p != rank]
        assert result["clean"] and result["elapsed"] < 5.0


def test_answers_sent_from_deliver_on_every_rank_do_not_deadlock(tworld):
    """deliver() may send (an agent answering from a completion callback) on every rank at once: all
    answers arrive intact and the transports still close cleanly."""
    count = 50
    for depth in (1, pg_transport.RECV_DEPTH):
        results = tworld.run(fns.echo_from_deliver, count, depth)
        for result in results:
            assert result["echoes"] == count * (tworld.world_size - 1) and result["wrong"] == [] and result["clean"]


def test_restarts_free_their_group_and_threads(tworld):
    """Starting and cleanly shutting down a transport 5 times leaves no process group and no thread behind."""
    results = tworld.run(fns.restart_cycles, 5)
    for result in results:
        assert result["received"] == 5 * (tworld.world_size - 1)
        assert result["groups"][1] == result["groups"][0], result
        assert result["threads"][1] <= result["threads"][0], result


def test_faulty_fails_first_sends_of_each_message_like_torch(tworld):
    """FaultyTransport fails the first num_fail_sends sends of each distinct PYTHON_CALL (torch keys by
    payload) with 'Send attempt failed intentionally', sends nothing for them, and passes other kinds."""
    if tworld.world_size != 2 and tworld.spec.name == "gloo":
        pytest.skip("fault counting does not depend on the world: ws2 and reference-ws4 cover it")
    results = tworld.run(fns.faulty_counts, 2, 4)
    for result in results:
        assert [s == "sent" for s in result["same"]] == [False, False, True, True]
        assert all("Send attempt failed intentionally for PYTHON_CALL" in s for s in result["same"][:2])
        assert all(s.startswith("IntentionalFailure") for s in result["distinct"])
        assert result["script"] == ["sent"] * 4
        assert result["failed_sends"] == 6
        assert result["arrived"] == [("PYTHON_CALL", "same", 2), ("PYTHON_CALL", "same", 3)] + \
            [("SCRIPT_CALL", "same", i) for i in range(4)]


def test_faulty_delay_holds_one_kind_without_blocking_sender_or_others(tworld):
    """A delayed kind arrives no sooner than its delay, and a frame of another kind sent after it (so
    send() did not wait out the delay) overtakes it."""
    if tworld.world_size != 2:
        pytest.skip("delay does not depend on the world size: ws2 covers it")
    delay = 0.4
    results = tworld.run(fns.faulty_delay, delay)
    ws = tworld.world_size
    for rank, result in enumerate(results):
        sender = results[(rank - 1) % ws]
        assert result["order"] == ["SCRIPT_CALL", "PYTHON_CALL"]
        assert result["arrived_at"]["PYTHON_CALL"] - sender["sent_at"] >= delay
        assert result["delayed_sends"] == 1


# --------------------------------------------------------------- through the agent
def test_rpc_sync_async_remote_over_reference_pg(tworld):
    """rpc_sync, rpc_async and remote().to_here() through the reference agent over reference-pg return
    the callee's results (strided, bfloat16, complex tensors included) and carry a remote error back."""
    results = tworld.run(fns.end_to_end)
    ws = tworld.world_size
    for rank, result in enumerate(results):
        assert result["sync"] == [[v + rank for v in row] for row in [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]
        assert result["async"] == [[10.0, 13.0], [11.0, 14.0], [12.0, 15.0]]
        assert result["remote"] == [2.0, 2.0]
        assert result["self"] == (rank, "me")
        assert result["where"] == ((rank + 1) % ws, [1 + 2j])
        assert result["error"].startswith("TypeError") and "can only concatenate str" in result["error"]


def test_many_concurrent_async_rpcs_all_complete(tworld):
    """Every rank keeps 100 rpc_async calls to every rank (itself included) in flight at once; all complete
    with the right values."""
    if tworld.world_size != 4:
        pytest.skip("the concurrency clause is about 4 ranks")
    per_peer = 100
    results = tworld.run(fns.many_async, per_peer)
    for result in results:
        assert result["calls"] == per_peer * tworld.world_size and result["wrong"] == []


def test_faulty_reference_pg_fails_like_torchs_faulty_agent(tworld):
    """Through the agent: with PYTHON_CALL failing twice per message, two identical rpc_syncs fail with
    torch's 'Send attempt failed intentionally' and the third succeeds; a delayed remote call completes late."""
    if tworld.world_size != 2:
        pytest.skip("fault injection does not depend on the world size: ws2 covers it")
    results = tworld.run(fns.faulty_end_to_end)
    for result in results:
        assert all("Send attempt failed intentionally for PYTHON_CALL" in c for c in result["calls"][:2])
        assert result["calls"][2] == [2.0]
        assert result["remote"] == [3.0] and result["remote_s"] >= 0.2


def test_call_to_a_worker_that_left_fails_promptly_naming_it(tworld):
    """After a worker shut down without the graceful handshake, a call to it fails at once with an error
    naming that worker and saying it shut down (not at the RPC timeout); every shutdown stays bounded."""
    results = tworld.run(fns.call_after_peer_left)
    assert "worker1" in results[0]["error"] and "rank 1 has shut down" in results[0]["error"], results[0]
    assert results[0]["error_s"] < 5.0
    assert all(result["shutdown_s"] < 5.0 for result in results), results


# --------------------------------------------------------------- a peer that dies
@pytest.mark.parametrize("backend", ["gloo", "reference"])
def test_dead_peer_is_named_and_shutdown_stays_bounded(backend, tmp_path):
    """When a peer process dies, a send to it raises TransportError naming it, on_peer_lost names it,
    and the survivors' shutdown returns in bounded time (a listener left blocked is reported, not awaited)."""
    ctx = multiprocessing.get_context("fork")  # torch is imported here already: a fork costs milliseconds
    ws = 3
    pipes, procs = [], []
    for rank in range(ws):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=peer_loss.survivor_view, args=(backend, rank, ws, str(tmp_path / "store"), sender),
                           daemon=True)
        proc.start()
        sender.close()
        pipes.append(receiver)
        procs.append(proc)
    try:
        views = [pipes[r].recv() if pipes[r].poll(60) else {"error": "no report within 60 s"} for r in range(ws - 1)]
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
    assert procs[-1].exitcode == 3
    for rank, view in enumerate(views):
        assert "error" not in view, view.get("error")
        assert view["send_error"].startswith("reference-pg: cannot send to rank 2: "), view
        assert 2 in view["lost"] and any("rank 2" in reason for reason in view["reasons"])
        assert view["shutdown_s"] < 3.0, view


# --------------------------------------------------------------- in one process
class Recorder(Transport):
    """An inner transport that records what reaches it, for FaultyTransport's unit clauses."""

    name = "recorder"

    def __init__(self):
        self.sent: list[tuple[int, Frame, float]] = []
        self.shut = False

    def start(self, rank, world_size, store, deliver, on_peer_lost):
        pass

    def send(self, dst, frame):
        self.sent.append((dst, frame, time.monotonic()))

    def shutdown(self, within_s=None):
        self.shut = True


@pytest.mark.parametrize("faults, text", [
    (Faults(fail=("PYTHON_CALL", "NOT_A_KIND")), "NOT_A_KIND"),
    (Faults(delay={"SCRIPT_RET": 1.0}), "SCRIPT_RET"),  # a response kind: torch cannot fault it either
    # torch's faulty agent cannot fault propagate-gradients requests either (only the clean-up is retryable)
    (Faults(fail=("BACKWARD_AUTOGRAD_REQ",)), "BACKWARD_AUTOGRAD_REQ"),
])
def test_faulty_rejects_unknown_kinds_listing_valid_ones(faults, text):
    """An unknown message kind name is a ValueError naming it and listing every valid kind."""
    with pytest.raises(ValueError) as info:
        FaultyTransport(Recorder(), faults)
    assert text in str(info.value)
    assert all(name in str(info.value) for name in FAULTABLE_KINDS)


@pytest.mark.parametrize("faults, text", [
    (Faults(delay={"PYTHON_CALL": -1}), "non-negative"),
    (Faults(fail=("PYTHON_CALL",), num_fail_sends=-2), "non-negative"),
])
def test_faulty_rejects_negative_numbers(faults, text):
    """A negative delay or fail count is a ValueError, as in torch's faulty agent."""
    with pytest.raises(ValueError, match=text):
        FaultyTransport(Recorder(), faults)


def test_faulty_counts_per_payload_exactly():
    """With num_fail_sends=3, each distinct payload fails exactly 3 times, then always passes; other kinds
    never fail."""
    inner = Recorder()
    faulty = FaultyTransport(inner, Faults(fail=("RREF_USER_DELETE", "PYTHON_CALL"), num_fail_sends=3))
    outcomes = {}
    for attempt in range(6):
        for header in (b"a", b"b"):
            for kind in (Kind.RREF_USER_DELETE, Kind.SCRIPT_CALL):
                try:
                    faulty.send(1, Frame(int(kind), attempt, header))
                    outcomes.setdefault((kind.name, header), []).append(True)
                except IntentionalFailure as exc:
                    assert "Send attempt failed intentionally for RREF_USER_DELETE" in str(exc)
                    outcomes.setdefault((kind.name, header), []).append(False)
    assert outcomes[("RREF_USER_DELETE", b"a")] == [False] * 3 + [True] * 3
    assert outcomes[("RREF_USER_DELETE", b"b")] == [False] * 3 + [True] * 3
    assert outcomes[("SCRIPT_CALL", b"a")] == [True] * 6
    assert faulty.failed_sends == 6
    assert len(inner.sent) == 6 + 12
    faulty.shutdown()
    assert inner.shut


def test_in_flight_credit_bounds_frames_and_bytes_but_never_the_listener():
    """send() waits once 2 frames or 100 bytes are in flight, and goes on when one completes; a sender
    that must not wait (the listener) passes anyway; one frame larger than the byte bound still passes."""
    credits = pg_transport._Credits(max_frames=2, max_bytes=100)
    credits.acquire(500)  # alone, even an oversized frame passes
    credits.release(500)
    credits.acquire(40)
    credits.acquire(40)
    blocked = threading.Thread(target=credits.acquire, args=(10,), daemon=True)
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive(), "a third frame went past a bound of 2"
    credits.acquire(10, wait=False)  # the listener's own frame
    assert credits.frames == 3
    credits.release(40)
    credits.release(10)
    blocked.join(2)
    assert not blocked.is_alive() and credits.frames == 2 and credits.bytes == 50


def test_faulty_zero_fail_sends_fails_nothing():
    """num_fail_sends=0 (torch's default) means a listed kind is never failed."""
    inner = Recorder()
    faulty = FaultyTransport(inner, Faults(fail=("PYTHON_CALL",)))
    for i in range(3):
        faulty.send(1, Frame(int(Kind.PYTHON_CALL), i, b"x"))
    assert len(inner.sent) == 3


def test_faulty_delay_is_per_kind_and_keeps_order_within_a_kind():
    """Delayed frames go out after their delay in their own order, from many senders, while undelayed
    kinds go out at once; frames still held at shutdown are dropped, not sent after it."""
    inner = Recorder()
    faulty = FaultyTransport(inner, Faults(delay={"PYTHON_CALL": 0.6, "PYTHON_REMOTE_CALL": 0.3}))
    faulty.start(0, 2, None, lambda *a: None, lambda *a: None)
    start = time.monotonic()
    for i in range(5):
        faulty.send(1, Frame(int(Kind.PYTHON_CALL), i, b""))
    faulty.send(1, Frame(int(Kind.PYTHON_REMOTE_CALL), 10, b""))
    faulty.send(1, Frame(int(Kind.SCRIPT_CALL), 20, b""))
    deadline = time.monotonic() + 5
    while len(inner.sent) < 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    ids = [frame.msg_id for _, frame, _ in inner.sent]
    assert ids == [20, 10, 0, 1, 2, 3, 4], "a delayed send held up its caller or the other kinds"
    at = {frame.msg_id: t - start for _, frame, t in inner.sent}
    assert at[10] >= 0.3 and all(at[i] >= 0.6 for i in range(5))
    faulty.send(1, Frame(int(Kind.PYTHON_CALL), 99, b""))
    faulty.shutdown()
    time.sleep(0.65)
    assert 99 not in [frame.msg_id for _, frame, _ in inner.sent]
    assert faulty.dropped_at_shutdown == 1 and inner.shut
    with pytest.raises(TransportError):
        faulty.send(1, Frame(int(Kind.PYTHON_CALL), 100, b""))


# --------------------------------------------------------------- framing, no wire
def _roundtrip(frame: Frame) -> tuple[Frame, int]:
    """Encode, then decode with the listener's own code; returns the frame and how many messages it took."""
    meta, body, datas = pg_codec.encode(frame)
    rest = ([body] if body is not None else []) + list(datas)
    messages = 1 + len(rest)

    def receive(nbytes):
        message = rest.pop(0)
        assert message.numel() == nbytes and message.dtype == torch.uint8
        return message.clone()

    out = pg_codec.read_frame(meta.numpy().tobytes(), 1, receive)
    assert rest == [], "the decoder left messages unread"
    return out, messages


def test_encoding_roundtrips_every_payload_case():
    """encode/decode (without the wire) reproduce every payload case bit for bit."""
    cases = fns.payload_cases()
    out, messages = _roundtrip(Frame(int(Kind.PYTHON_CALL), 2**62, pickle.dumps("h"), [t for _, t in cases]))
    assert out.msg_id == 2**62 and pickle.loads(out.header) == "h"
    assert [name for (name, t), got in zip(cases, out.tensors) if not fns._same(t, got)] == []
    assert messages > 2
    for name, tensor in cases:
        out, messages = _roundtrip(Frame(int(Kind.SCRIPT_RET), -5, b"x", [tensor]))
        assert fns._same(tensor, out.tensors[0]) and out.header == b"x" and out.msg_id == -5, name
        assert messages == (1 if tensor.numel() * tensor.element_size() < 4000 else 3), name


def test_small_frames_travel_in_one_message_large_ones_split():
    """A frame whose header, descriptors and bytes fit the 4 KiB meta is one c10d message; one byte more
    moves the header to a body message and each tensor to its own."""
    room = pg_codec.INLINE_CAPACITY
    out, messages = _roundtrip(Frame(1, 1, b"h" * room))
    assert messages == 1 and out.header == b"h" * room
    out, messages = _roundtrip(Frame(1, 1, b"h" * (room + 1)))
    assert messages == 2 and out.header == b"h" * (room + 1)
    desc = 8 * 3  # dtype code, ndim, one size
    out, messages = _roundtrip(Frame(1, 1, b"", [torch.ones(room - desc, dtype=torch.uint8)]))
    assert messages == 1 and out.tensors[0].tolist() == [1] * (room - desc)
    out, messages = _roundtrip(Frame(1, 1, b"", [torch.ones(room - desc + 1, dtype=torch.uint8)]))
    assert messages == 3
    assert _roundtrip(Frame(1, 1, b""))[1] == 1


def test_batch_meta_carries_records_in_order_each_checked_like_a_frame():
    """Several inline frames in one batch meta come out as they went in, in order; a batch whose
    records lie (cut short, stray bytes, a split or STOP record inside, a zero count) is a ProtocolError."""
    frames = [Frame(int(Kind.PYTHON_CALL), i, pickle.dumps(i) * (i + 1), [torch.arange(i, dtype=torch.int64)])
              for i in range(5)] + [Frame(int(Kind.EXCEPTION), 9, b"")]
    records = [pg_codec.encode_frame(f)[0] for f in frames]
    meta = pg_codec.batch_meta(records)
    out = pg_codec.read_frames(meta.numpy().tobytes(), 1, None)
    assert [(f.kind, f.msg_id, f.header) for f in out] == [(f.kind, f.msg_id, f.header) for f in frames]
    assert [f.tensors[0].tolist() if f.tensors else None for f in out] == \
        [list(range(i)) for i in range(5)] + [None]
    with pytest.raises(ProtocolError, match="where one was expected"):
        pg_codec.read_frame(meta.numpy().tobytes(), 1, None)
    body = b"".join(records)
    stop = pg_codec.encode_frame(Frame(pg_codec.STOP_KIND, 0, b""))[0]
    bad = {
        "cut short": _fields(pg_codec.MAGIC, 0, 0, len(body) - 3, 0, 0, 2, 6) + body[:-3],
        "stray": _fields(pg_codec.MAGIC, 0, 0, len(body) + 8, 0, 0, 2, 6) + body + bytes(8),
        "count": _fields(pg_codec.MAGIC, 0, 0, len(body), 0, 0, 2, 0) + body,
        "stop inside": _fields(pg_codec.MAGIC, 0, 0, len(stop), 0, 0, 2, 1) + stop,
        "data length": _fields(pg_codec.MAGIC, 0, 0, len(records[2]), 0, 0, 2, 1)
                       + records[2][:56] + struct.pack("<q", 7) + records[2][64:],
    }
    for name, raw in bad.items():
        with pytest.raises(ProtocolError, match="rank 1"):
            pg_codec.read_frames(raw.ljust(pg_codec.META_BYTES, b"\0"), 1, None)
        assert name


def test_only_frames_that_fit_a_batch_are_queued():
    """A record as large as a whole meta fits alone but not next to a batch's fields: batch_meta refuses it."""
    room = pg_codec.INLINE_CAPACITY
    record = pg_codec.encode_frame(Frame(1, 1, b"h" * room))[0]
    assert record is not None and len(record) > room
    with pytest.raises(ValueError, match="does not fit"):
        pg_codec.batch_meta([record])


@pytest.mark.parametrize("frame, error, text", [
    (Frame(1, 0, b"", [torch.ones(2).to_sparse()]), ValueError, "layout"),
    (Frame(1, 0, b"", [torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)]), ValueError, "dtype"),
    (Frame(1, 0, b"", [[1, 2]]), TypeError, "not a torch.Tensor"),
    (Frame(1, 0, "text"), TypeError, "header must be bytes"),
    (Frame(1, 2**64, b""), ValueError, "msg_id"),
], ids=["sparse", "quantized", "list", "str-header", "huge-id"])
def test_unsendable_frames_are_refused_before_the_wire(frame, error, text):
    """A frame that cannot travel is refused with an error naming the problem, before anything is sent."""
    with pytest.raises(error, match=text):
        pg_codec.encode(frame)


def _fields(*values):
    return pg_codec._FIELDS.pack(*values)


@pytest.mark.parametrize("raw", [
    _fields(0, 1, 2, 0, 0, 0, 0, 0),
    _fields(pg_codec.MAGIC, 1, 2, -1, 0, 0, 0, 0),
    _fields(pg_codec.MAGIC, 1, 2, 0, 0, 0, 7, 0),
    _fields(pg_codec.MAGIC, 1, 2, 5000, 0, 0, 1, 0),
    _fields(pg_codec.MAGIC, 1, 2, 0, 1, 0, 1, 0),
    _fields(pg_codec.MAGIC, 1, 2, 0, 1, 24, 1, 0) + struct.pack("<3q", 999, 1, 2),
    _fields(pg_codec.MAGIC, 1, 2, 0, 1, 24, 1, 0) + struct.pack("<3q", 0, 1, 2000),
    _fields(pg_codec.MAGIC, 1, 2, 0, 0, 8, 1, 0) + struct.pack("<q", 5),
    _fields(pg_codec.MAGIC, 1, 2, 0, 0, 0, 1, 16),
    # sizes no tensor has: refused before anything is allocated (torch.empty would try)
    _fields(pg_codec.MAGIC, 1, 2, 0, 1, 24, 1, 0) + struct.pack("<3q", 0, 1, 1 << 50),
    _fields(pg_codec.MAGIC, 1, 2, 0, 1, 32, 1, 0) + struct.pack("<4q", 0, 2, 1 << 30, 1 << 30),
    _fields(pg_codec.MAGIC, 1, 2, 0, 1, 24, 0, 0),  # the same lie in a split frame's body
], ids=["magic", "negative", "flag", "inline-overflow", "missing-descriptor", "dtype-code", "short-data",
        "stray-descriptor", "data-length", "huge-size", "huge-numel", "split-huge-size"])
def test_garbled_meta_is_a_frame_error_naming_the_sender(raw):
    """A garbled frame is a ProtocolError naming the sending rank, never a crash or a wrong tensor."""
    def receive(nbytes: int) -> torch.Tensor:  # a split frame's body: one huge-size descriptor
        assert nbytes == 24, f"asked for {nbytes} bytes before the descriptors were checked"
        return torch.frombuffer(bytearray(struct.pack("<3q", 0, 1, 1 << 50)), dtype=torch.uint8)

    with pytest.raises(ProtocolError, match="rank 3"):
        pg_codec.read_frame(raw.ljust(pg_codec.META_BYTES, b"\0"), 3, receive)


def test_every_reference_wire_carries_the_same_dtypes():
    """reference-tp, reference-pg and the c10d reference backend share one dtype table (backends/reference/codec.py)."""
    from backends.reference import codec, wire
    from backends.reference.rpc import tp_codec

    table = [getattr(torch, name) for name in codec.DTYPE_TABLE if hasattr(torch, name)]
    assert list(tp_codec.DTYPES) == list(pg_codec.DTYPE_CODES) == list(wire.DTYPES.values()) == table
    assert {torch.complex32, torch.uint16, torch.float8_e4m3fn} <= set(table)


def test_send_before_start_and_to_self_are_refused():
    """send() before start() is a TransportError, to itself or out of range a ValueError (both naming the
    rank), a non-Frame a TypeError, the reserved STOP kind a ValueError."""
    transport = PgTransport()
    with pytest.raises(ValueError, match="rank 5"):
        transport.send(5, Frame(1, 0, b""))
    transport._world_size, transport._rank = 2, 0  # as start() would, without a group
    with pytest.raises(TypeError, match="Frame"):
        transport.send(1, (1, 0, b""))
    with pytest.raises(ValueError, match="reserved"):
        transport.send(1, Frame(pg_codec.STOP_KIND, 0, b""))
    transport._dst_locks = {1: threading.Lock()}
    with pytest.raises(TransportError, match="cannot send to rank 1: the transport is not started"):
        transport.send(1, Frame(1, 0, b""))
    transport.shutdown()  # before start: a no-op, idempotent
    transport.shutdown()


def test_a_backend_without_cpu_tensors_needs_its_device_here():
    """Frames travel on the host over a backend that moves CPU tensors; over one that moves none (nccl) they are
    staged through its device, and a process without that device is refused with a reason, before any collective."""
    assert pg_transport.frame_device("gloo") is None
    with pytest.raises(RuntimeError, match=r"only moves tensors on \['cuda'\], which this process does not have"):
        pg_transport.frame_device("nccl")


def test_start_without_default_group_says_what_is_missing():
    """start() without torch.distributed's default group says to call init_process_group first."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("this pytest process has a default group")
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="init_process_group"):
        PgTransport().start(0, 2, None, lambda *a: None, lambda *a: None)
    assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("reference-pg")]
