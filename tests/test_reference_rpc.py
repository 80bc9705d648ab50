"""The reference RPC agent's own machinery (backends/reference/rpc: agent, RRefs, reference-tp).

Contract: the agent answers torch.distributed.rpc's API (rpc_sync, rpc_async,
remote, RRef proxies, to= by name/rank/WorkerInfo, builtins, TorchScript and
Python functions, @async_execution) with torch's error types and texts, over
reference-tp and reference-pg, at world sizes 2 and 3; it starts, shuts down
and starts again in the same processes; its timeout watchdog fails late calls
with torch's text and drops their late answers; graceful shutdown waits for
work in flight and an ungraceful one fails it; a blocking function does not
stop a callee from serving. reference-tp refuses strangers with a reason and
drops a connection that sends a malformed frame (garbled bytes, wrong lengths,
huge claimed sizes, bad dtypes or strides), logging why, while every other
peer keeps being served; frames carry every dtype and layout intact.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time

import pytest
import torch
import torch.distributed as dist

from backends.reference.rpc import tp_codec
from backends.reference.rpc.tp_codec import MAGIC, PREFIX, TENSOR, VERSION, encode
from backends.reference.rpc.tp_transport import TpTransport
from backends.reference.rpc.transport import Frame, Kind, TransportError
from backends.registry import BackendRegistry
from fixtures.pool import WorldPool
from tests.rpc_cases import agent_fns as fns
from tests.rpc_cases.in_process import agents_with_fake_peer

pytestmark = pytest.mark.timeout(180)

TIMEOUT_TEXT = r"RPCErr:1:RPC ran for more than set timeout \(\d+ ms\) and will now be marked with an error"
NOT_INITIALIZED = "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first."


# =================================================================== in one process
class Inbox:
    """deliver()/on_peer_lost() of one transport, recorded."""

    def __init__(self):
        self.frames: list = []
        self.lost: list = []
        self.cond = threading.Condition()

    def deliver(self, src, frame):
        with self.cond:
            self.frames.append((src, frame))
            self.cond.notify_all()

    def on_lost(self, peer, reason):
        with self.cond:
            self.lost.append((peer, reason))
            self.cond.notify_all()

    def wait_for(self, predicate, timeout=10.0):
        end = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                remaining = end - time.monotonic()
                assert remaining > 0, f"timed out; frames {len(self.frames)}, lost {self.lost}"
                self.cond.wait(remaining)


def start_transports(world_size, ranks=None):
    """TpTransports for ``ranks`` (default all) of a world over one HashStore, started in threads."""
    store = dist.HashStore()
    ranks = list(range(world_size)) if ranks is None else ranks
    transports = {r: TpTransport(connect_timeout=10.0) for r in ranks}
    inboxes = {r: Inbox() for r in ranks}
    errors = []

    def run(r):
        try:
            transports[r].start(r, world_size, store, inboxes[r].deliver, inboxes[r].on_lost)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    return store, transports, inboxes, threads, errors


@pytest.fixture
def pair():
    store, transports, inboxes, threads, errors = start_transports(2)
    for t in threads:
        t.join(15)
    assert not errors, errors
    yield transports, inboxes
    for t in transports.values():
        t.shutdown()


def payloads():
    yield "empty", []
    yield "scalar", [torch.tensor(3.5)]
    for dtype in tp_codec.DTYPES:  # the table every reference wire shares: complex32 and float8 included
        yield str(dtype), [(torch.arange(12) % 2).to(dtype).reshape(3, 4) if dtype == torch.bool
                           else torch.arange(12).to(dtype).reshape(3, 4)]
    yield "transposed", [torch.arange(12.).reshape(3, 4).t()]
    yield "sliced", [torch.arange(20.)[3:17:2]]
    yield "one element odd stride", [torch.arange(10.)[4:5]]
    yield "zero elements", [torch.empty(0, 3), torch.empty(2, 0, 5, dtype=torch.int64)]
    yield "expanded", [torch.tensor([1., 2.]).expand(3, 2)]
    yield "several", [torch.ones(2), torch.zeros(3, dtype=torch.int8), torch.randn(4, 4)]
    yield "large", [torch.randn(300_000)]


def test_frames_arrive_intact_and_in_order(pair):
    """Every frame arrives once, in send order, header bytes and tensors (every dtype and layout) intact."""
    transports, inboxes = pair
    sent = []
    for i, (label, tensors) in enumerate(payloads()):
        header = f"header {label}".encode() * (i + 1)
        transports[0].send(1, Frame(int(Kind.PYTHON_CALL), i, header, tensors))
        sent.append((label, header, tensors))
    inboxes[1].wait_for(lambda: len(inboxes[1].frames) == len(sent))
    for (label, header, tensors), (src, frame) in zip(sent, inboxes[1].frames):
        assert src == 0 and frame.header == header and frame.kind == Kind.PYTHON_CALL, label
        assert len(frame.tensors) == len(tensors), label
        for want, got in zip(tensors, frame.tensors):
            assert got.dtype == want.dtype and got.shape == want.shape and same_bits(got, want), label
    # the other direction over the same connection
    transports[1].send(0, Frame(int(Kind.PYTHON_RET), 7, b"back", [torch.ones(2)]))
    inboxes[0].wait_for(lambda: inboxes[0].frames)
    assert inboxes[0].frames[0][1].msg_id == 7 and not inboxes[0].lost and not inboxes[1].lost


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit equal (torch.equal has no kernel for complex32 or the float8 kinds)."""
    return torch.equal(got.contiguous().reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8))


def test_shutdown_at_once_after_start_meets_only_running_writers(monkeypatch):
    """start() returns once every peer's connection is published, and a connection is published only with its writer
    running: a shutdown at once joins running writers (CI once saw "cannot join thread before it is started")."""
    real_start = threading.Thread.start

    def slow_writer_start(thread):
        # a connection the listener adopts (rank 0's, dialled by rank 1) starts its writer late: the window in which
        # the connection was published and rank 0's start() could return with that writer not started
        if thread.name.startswith("rpc-tp-write") and threading.current_thread().name.startswith("rpc-tp"):
            time.sleep(0.5)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", slow_writer_start)
    _, transports, _, threads, errors = start_transports(2)
    for t in threads:
        t.join(15)
    assert not errors, errors
    for t in transports.values():
        t.shutdown()


def test_send_to_unknown_rank_and_unsupported_dtype(pair):
    """Sending to a rank that is not a peer, or a dtype the wire has no code for, raises TransportError naming it."""
    transports, _ = pair
    with pytest.raises(TransportError, match="no peer rank 5"):
        transports[0].send(5, Frame(int(Kind.PYTHON_CALL), 1, b"", []))
    quantized = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    with pytest.raises(TransportError, match="qint8"):
        transports[0].send(1, Frame(int(Kind.PYTHON_CALL), 1, b"", [quantized]))


def test_refused_strangers_get_a_reason(pair):
    """A connection without the right token (or claiming a rank it may not) is refused with a reason; the pair keeps working."""
    transports, inboxes = pair
    host, port = transports[0].address
    hellos = [{"token": "wrong", "rank": 1}, {"rank": 1}, {"token": transports[0]._token.decode(), "rank": 1},
              {"token": transports[0]._token.decode(), "rank": 0}, {"token": transports[0]._token.decode(), "rank": 9}]
    reasons = []
    for hello in hellos + [None]:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(tp_codec.hello_bytes(tp_codec.HELLO, hello) if hello else b"\x00" * 64)
            kind, body = tp_codec.read_control(sock)
            assert kind == tp_codec.REFUSED
            reasons.append(body["reason"])
    assert reasons[0] == reasons[1] == "wrong world token"
    assert "already connected" in reasons[2]
    assert "not a rank that dials rank 0" in reasons[3] and "not a rank that dials rank 0" in reasons[4]
    assert "not a reference-tp peer" in reasons[5]
    assert len(transports[0].refused) == len(reasons)
    transports[1].send(0, Frame(int(Kind.PYTHON_CALL), 1, b"still here", []))
    inboxes[0].wait_for(lambda: inboxes[0].frames)
    assert not inboxes[0].lost


ARANGE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
                 torch.int64, torch.uint8)


def valid_frame_bytes(rng: random.Random) -> bytes:
    tensors = [torch.arange(rng.randint(0, 6), dtype=rng.choice(ARANGE_DTYPES))
               for _ in range(rng.randint(0, 2))]
    return b"".join(bytes(p) for p in encode(Frame(int(Kind.PYTHON_CALL), rng.randint(0, 99), b"h" * rng.randint(0, 9),
                                                    tensors)))


def malformed(rng: random.Random, case: int) -> tuple[str, bytes]:
    """A frame that must be refused: each kind of lie the validator knows about, then random damage."""
    good = valid_frame_bytes(rng)
    if case == 0:
        return "bad magic", b"XXXX" + good[4:]
    if case == 1:
        return "bad version", good[:4] + bytes([VERSION + 1]) + good[5:]
    if case == 2:
        return "unknown kind", good[:5] + bytes([rng.choice([0, 10, 99, 254, 255])]) + good[6:]
    if case == 3:
        return "too many tensors", PREFIX.pack(MAGIC, VERSION, 2, 60000, 1, 0)
    if case == 4:
        return "huge header", PREFIX.pack(MAGIC, VERSION, 2, 0, 1, (1 << 32) - 1)
    if case == 5:
        return "bad dtype", PREFIX.pack(MAGIC, VERSION, 2, 1, 1, 0) + TENSOR.pack(200, 1, 8) + struct.pack("<2q", 2, 1)
    if case == 6:
        return "too many dims", PREFIX.pack(MAGIC, VERSION, 2, 1, 1, 0) + TENSOR.pack(0, 40, 4)
    if case == 7:
        return "huge tensor", PREFIX.pack(MAGIC, VERSION, 2, 1, 1, 0) + TENSOR.pack(0, 1, 1 << 40) + \
            struct.pack("<2q", 1 << 38, 1)
    if case == 8:
        return "bytes disagree with shape", PREFIX.pack(MAGIC, VERSION, 2, 1, 1, 0) + TENSOR.pack(0, 1, 12) + \
            struct.pack("<2q", 4, 1) + bytes(12)
    if case == 9:
        return "negative stride", PREFIX.pack(MAGIC, VERSION, 2, 1, 1, 0) + TENSOR.pack(0, 1, 16) + \
            struct.pack("<2q", 4, -1) + bytes(16)
    if case == 10:
        return "stride past the data", PREFIX.pack(MAGIC, VERSION, 2, 1, 1, 0) + TENSOR.pack(0, 2, 16) + \
            struct.pack("<4q", 2, 2, 1, 1000) + bytes(16)
    if case == 11:
        return "odd byte count", PREFIX.pack(MAGIC, VERSION, 2, 1, 1, 0) + TENSOR.pack(0, 1, 6) + \
            struct.pack("<2q", 1, 1) + bytes(6)
    if case == 12:
        return "truncated", good[:rng.randint(1, len(good) - 1)]
    if case == 13:
        return "claims more data than sent", PREFIX.pack(MAGIC, VERSION, 2, 0, 1, 1 << 20) + b"x" * 100
    # random damage to a valid frame: flipped bytes in its prefix, then garbage
    data = bytearray(good)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(min(len(data), PREFIX.size + 12))] = rng.randrange(256)
    return "random damage", bytes(data) + bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))


# what the refusal must name, for the lies whose data is all there (only validation can catch them)
WHY = {"bad magic": "bad magic", "bad version": "version", "unknown kind": "kind", "too many tensors": "tensors in one frame",
       "huge header": "exceeds", "bad dtype": "unknown dtype code 200", "too many dims": "dims", "huge tensor": "exceeds",
       "bytes disagree with shape": "12 data bytes", "negative stride": "negative size or stride",
       "stride past the data": "16 data bytes", "odd byte count": "not a whole number", "truncated": "truncated",
       "claims more data than sent": "truncated"}


def test_fuzzed_frames_drop_only_their_connection():
    """Hundreds of malformed frames from a peer: each drops that peer's connection with a logged reason, nothing is delivered, other peers keep working."""
    store, transports, inboxes, threads, errors = start_transports(3, ranks=[0, 1])
    token = store.get("tp/token").decode()
    rng = random.Random(20261121)
    # rank 2 is the fuzzer: an honest hello to rank 1 (kept open, idle), then lies to rank 0
    host1, port1 = store.get("tp/addr/1").decode().rsplit(":", 1)
    honest = socket.create_connection((host1, int(port1)), timeout=5)
    honest.sendall(tp_codec.hello_bytes(tp_codec.HELLO, {"token": token, "rank": 2}))
    try:
        outcomes = {}
        for attempt in range(300):
            case = attempt if attempt < 14 else 14
            host, port = store.get("tp/addr/0").decode().rsplit(":", 1)
            label, data = malformed(rng, case)
            before_frames, before_lost = len(inboxes[0].frames), len(inboxes[0].lost)
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(tp_codec.hello_bytes(tp_codec.HELLO, {"token": token, "rank": 2}))
                if attempt == 0:  # the first hello completes rank 0's and 1's start
                    for t in threads:
                        t.join(15)
                    assert not errors, errors
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)  # a frame claiming more than was sent ends at EOF
                inboxes[0].wait_for(lambda: len(inboxes[0].lost) > before_lost)
            peer, reason = inboxes[0].lost[-1]
            delivered = inboxes[0].frames[before_frames:]
            assert peer == 2
            if label == "random damage" and delivered:  # damage that left a valid frame: delivered, then EOF
                assert "closed the connection" in reason or "malformed" in reason, reason
            else:
                assert not delivered, f"{label}: delivered {delivered}"
                assert "malformed frame" in reason and WHY.get(label, "") in reason, f"{label}: {reason}"
            outcomes.setdefault(label, reason)
            if attempt % 50 == 0:  # the honest pair still talks, both ways
                transports[1].send(0, Frame(int(Kind.PYTHON_CALL), attempt, b"ok", [torch.ones(2)]))
                transports[0].send(1, Frame(int(Kind.PYTHON_RET), attempt, b"ok", []))
                inboxes[0].wait_for(lambda: any(f.header == b"ok" and f.msg_id == attempt
                                                for _, f in inboxes[0].frames))
                inboxes[1].wait_for(lambda: any(f.msg_id == attempt for _, f in inboxes[1].frames))
        assert len(transports[0].dropped) >= 250
        assert not inboxes[1].lost and not [lost for lost in inboxes[0].lost if lost[0] != 2]
        for label, reason in outcomes.items():
            print(f"{label}: {reason}")
    finally:
        honest.close()
        for t in transports.values():
            t.shutdown()


def test_malformed_frame_fails_that_peers_calls_only():
    """Agents in one process: a peer that sends a malformed frame is dropped and the calls waiting on it fail with the reason; calls to other peers go on."""
    with agents_with_fake_peer() as live:  # rank 2 is this test: it dials both agents honestly
        waiting = live.call(0, 2, fns.add, 1, 2)  # rank 2 never answers
        assert torch.equal(live.call(0, 1, fns.add, torch.ones(2), 1).wait(), torch.full((2,), 2.0))
        live.fake[0].sendall(b"DCRP" + bytes([9]) + bytes(40))  # version 9: malformed
        with pytest.raises(RuntimeError, match=r"RPC to WorkerInfo\(id=2, name=worker2\) failed: rank 2 sent a "
                                               r"malformed frame \(unsupported protocol version 9\)"):
            waiting.wait()
        assert torch.equal(live.call(0, 1, fns.add, torch.ones(2), 2).wait(), torch.full((2,), 3.0))
        assert torch.equal(live.call(1, 0, fns.add, torch.ones(2), 3).wait(), torch.full((2,), 4.0))
        assert live.agents[0].transport.dropped and not live.agents[1].transport.dropped


def test_start_times_out_naming_missing_ranks():
    """A rank that never dials makes start() fail within connect_timeout, naming it."""
    store = dist.HashStore()
    transport = TpTransport(connect_timeout=0.5)
    with pytest.raises(TransportError, match=r"ranks \[1\] did not connect within 0.5 s"):
        transport.start(0, 2, store, lambda *a: None, lambda *a: None)


def test_options_are_checked():
    """Bad options are refused with an error naming the field."""
    from backends.reference.rpc import ReferenceRpcBackendOptions, init_rpc

    with pytest.raises(ValueError, match="unknown reference RPC agent 'nope'"):
        ReferenceRpcBackendOptions(agent="nope", store=dist.HashStore())
    with pytest.raises(ValueError, match="num_worker_threads"):
        ReferenceRpcBackendOptions(num_worker_threads=0, store=dist.HashStore())
    with pytest.raises(ValueError, match="rpc_timeout"):
        ReferenceRpcBackendOptions(rpc_timeout=-1, store=dist.HashStore())
    with pytest.raises(TypeError, match="ReferenceRpcBackendOptions"):
        init_rpc("w0", rank=0, world_size=1, rpc_backend_options=object())
    with pytest.raises(RuntimeError, match="Worker name must match"):
        init_rpc("bad name!", rank=0, world_size=1, rpc_backend_options=ReferenceRpcBackendOptions(store=dist.HashStore()))


# =================================================================== live worlds
@pytest.fixture(scope="module")
def pool():
    pool = WorldPool(BackendRegistry(), deadline=60.0, max_alive=1)
    yield pool
    pool.close_all()


@pytest.fixture(scope="module", params=[2, 3], ids=["ws2", "ws3"])
def rworld(request, pool):
    return pool.get("gloo", request.param)


def pg_available() -> bool:
    try:
        import backends.reference.rpc.pg_transport  # noqa: F401
    except ImportError:
        return False
    return True


AGENTS = ["reference-tp", pytest.param("reference-pg", marks=pytest.mark.skipif(
    not pg_available(), reason="backends/reference/rpc/pg_transport.py is not there yet"))]


@pytest.mark.parametrize("agent", AGENTS)
def test_calls_of_every_kind(rworld, agent):
    """rpc_sync/rpc_async/remote with Python, builtin and TorchScript functions, to= by name/rank/WorkerInfo, self-calls, RRef proxies and RRef arguments all return the callee's result."""
    ws = rworld.world_size
    for rank, out in enumerate(rworld.run(fns.basics, agent)):
        to = (rank + 1) % ws
        assert torch.equal(out["sync_python"], torch.ones(2) + rank)
        assert out["sync_by_rank"] == out["sync_by_info"] == f"worker{to}" and out["self"] == f"worker{rank}"
        assert torch.equal(out["builtin"], torch.full((2,), 2.0)) and torch.equal(out["script"], torch.full((2,), 3.0))
        assert out["kwargs"] == 3 and out["async"] == (1 + rank) * 10 and out["async_execution"] == 20
        assert torch.equal(out["tensor_layouts"], torch.arange(6.).reshape(2, 3).t())
        assert out["many"] == list(range(50))
        assert out["remote_owner"] == (f"worker{to}", False)
        assert (out["proxy_sync"], out["proxy_async"], out["proxy_remote"]) == (rank + 1, rank + 2, rank + 3)
        assert out["confirmed"] and out["rref_as_arg"] == 3.0 and out["local_rref"] == (True, 14.0)
        assert out["remote_error"][0] == "ValueError" and "in remote" in out["remote_error"][1]
        kind, text = out["udf_error"]
        # TensorPipe's text: "ValueError: On WorkerInfo(id=1, name=worker1):\nValueError('marker-17')\nTraceback..."
        assert kind == "ValueError" and text.startswith(f"ValueError: On WorkerInfo(id={to}, name=worker{to}):\n"
                                                        "ValueError('marker-17')\nTraceback")


def test_init_shutdown_init_again(rworld):
    """init_rpc, calls, shutdown, then init_rpc again (either agent) in the same processes, many times."""
    agents = ["reference-tp", "reference-tp", "reference-pg", "reference-tp"] if pg_available() else \
        ["reference-tp"] * 3
    for rank, results in enumerate(rworld.run(fns.init_shutdown_cycles, agents)):
        assert results == [(agent, f"worker{(rank + 1) % rworld.world_size}", rank) for agent in agents]


def test_calls_outside_an_agent_raise_torchs_error(rworld):
    """Before init_rpc and after shutdown every call raises torch's RuntimeError; a second init_rpc says RPC is already initialized."""
    for before, during, again, after in rworld.run(fns.not_initialized):
        assert before == ("RuntimeError", NOT_INITIALIZED) and during == 0
        assert again == ("RuntimeError", "RPC is already initialized")
        assert after == [("RuntimeError", NOT_INITIALIZED)] * 5


def test_addressing_errors_are_torchs(rworld):
    """to= a float raises ValueError, an unknown rank or name RuntimeError with TensorPipe's text, a non-callable TypeError."""
    ws = rworld.world_size
    for rank, got in enumerate(rworld.run(fns.addressing_errors)):
        me = f"name:worker{rank},rank:{rank}"
        assert got == [("ValueError", "Cannot get WorkerInfo from name 1.5"),
                       ("RuntimeError", f"{me} could not find destination id {ws}"),
                       ("RuntimeError", f"{me} could not find destination id -1"),
                       ("RuntimeError", f"{me} could not find destination name nobody"),
                       ("TypeError", "function should be callable."),
                       ("RuntimeError", f"{me} could not find destination name nobody")]


def test_duplicate_names_refused(rworld):
    """Two workers with one name: init_rpc fails on every worker with an error naming the name and both ranks."""
    for got in rworld.run(fns.duplicate_names):
        assert got == ("RuntimeError", "RPC worker name 'same' is used by ranks 0 and 1; every worker needs a unique name")


def test_timeout_watchdog(rworld):
    """Calls that outlive their timeout (per call, default, to_here) fail with torch's text in time; timeout=0 waits; late answers are dropped."""
    for rank, out in enumerate(rworld.run(fns.timeouts)):
        for what in ("per_call", "async", "to_here"):
            kind, text, took = out[what]
            assert kind == "RuntimeError" and text == \
                "RPCErr:1:RPC ran for more than set timeout (200 ms) and will now be marked with an error", (what, text)
            assert 0.19 <= took < 0.9, f"rank {rank} {what}: failed after {took:.3f} s"
        kind, text, took = out["default"]
        assert kind == "RuntimeError" and "(300 ms)" in text and 0.29 <= took < 0.95
        assert out["no_timeout"][:2] == (None, "in time")
        assert out["after"] == 3 and out["pending"] == 0


def test_blocking_function_does_not_stop_serving(rworld):
    """While a callee runs a blocking function, its other requests are still answered promptly."""
    for rank, out in enumerate(rworld.run(fns.blocking_callee)):
        kind, value, took = out["quick"]
        assert kind is None and value == 2 and took < 0.5, f"rank {rank}: quick call {out['quick']}"
        assert out["slow"] == "slow"


def test_graceful_shutdown_waits_for_work_in_flight(rworld):
    """shutdown() on every worker while calls are running: the calls complete with their values, then all stop."""
    results = rworld.run(fns.graceful_shutdown_in_flight)
    assert results[0]["values"] == list(range(1, rworld.world_size))
    assert all(r["took"] >= 0.3 for r in results), [r["took"] for r in results]


def test_ungraceful_shutdown_fails_pending(rworld):
    """shutdown(graceful=False) does not wait: a pending call's future fails with an error saying the agent shut down."""
    kind, text = rworld.run(fns.ungraceful_shutdown_fails_pending)[0]["pending"]
    assert kind == "RuntimeError" and "was shut down before the call completed" in text


def test_strangers_refused_agent_keeps_serving(rworld):
    """reference-tp refuses connections with a wrong or no token, garbage, or a claimed rank, answering with the reason; calls keep working."""
    ws = rworld.world_size
    for rank, out in enumerate(rworld.run(fns.stranger_refused)):
        reasons = [reason for _, reason in out["replies"]]
        assert all(kind == tp_codec.REFUSED for kind, _ in out["replies"])
        assert reasons[:2] == ["wrong world token"] * 2 and "not a reference-tp peer" in reasons[2]
        # rank ws-1 dials every lower rank (connected since the barrier); no rank dials itself
        target = (rank + 1) % ws
        assert reasons[3] == (f"rank {ws - 1} is already connected" if target < ws - 1 else
                              f"rank {ws - 1} is not a rank that dials rank {target} (world size {ws})"), reasons[3]
        assert torch.equal(out["still"], torch.full((2,), 2.0)) and len(out["refused"]) == 4


def test_graceful_shutdown_after_a_lost_link(pool):
    """A call lost with its connection fails, and graceful shutdown still returns on every worker (it waited for ever)."""
    results = pool.get("gloo", 3).run(fns.claimed_before_connect)
    kind, text = results[1]["call"]
    assert kind == "RuntimeError" and "RPC to WorkerInfo(id=2, name=worker2) failed" in text, text
    assert len(results[1]["refused"]) == 1 and "rank 2 is already connected" in results[1]["refused"][0]
    assert results[0]["refused"] == results[2]["refused"] == []
    assert all("shutdown_s" in out for out in results)


def test_profiled_calls_carry_remote_events(rworld):
    """Under the legacy profiler an RPC is recorded under torch's key, with the callee's ops as #remote_op: rows."""
    ws = rworld.world_size
    for rank, names in enumerate(rworld.run(fns.profiled_call)):
        to = (rank + 1) % ws
        key = f"rpc_sync#aten::add(worker{rank} -> worker{to})"
        assert key in names and f"{key}#remote_op: aten::add" in names, names
        assert f"rpc_async#add(worker{rank} -> worker{to})#remote_op: aten::add" in names, names


def test_rrefs_freed_when_no_user_is_left(rworld):
    """Values whose RRefs (forks on other workers included) were all dropped are freed on the owner; a held RRef's value stays."""
    ws = rworld.world_size
    for rank, out in enumerate(rworld.run(fns.rref_lifetimes)):
        assert out["sums"] == [3.0] * 5 + [4.0, 5]
        # every worker owns exactly the one value its predecessor still holds
        assert out["counts"] == [1] * ws, f"rank {rank}: values left per owner {out['counts']}"
        assert torch.equal(out["kept"], torch.full((2,), float(rank)))
