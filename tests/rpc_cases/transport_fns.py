"""Rank-side functions of tests/test_rpc_transports.py: reference RPC transports driven directly.

Each function runs on every rank (``World.run``), starts a transport on the
case's private store, does its exchange, shuts the transport down on every
rank and returns what it observed; the test checks it. No agent is involved:
frames are built here and ``deliver`` records them.
"""

from __future__ import annotations

import pickle
import threading
import time

import torch

from backends.reference.rpc.faulty import FaultyTransport
from backends.reference.rpc.pg_codec import DTYPE_CODES
from backends.reference.rpc.pg_transport import PgTransport
from backends.reference.rpc.transport import Frame, Kind, TransportError
from backends.rpc_agents import Faults
from fixtures.rank import ctx

RECEIVE_WAIT_S = 20.0


class Inbox:
    """deliver() and on_peer_lost() of a test: records everything, lets a rank wait for N frames."""

    def __init__(self):
        self.frames: list[tuple[int, Frame, float]] = []
        self.lost: list[tuple[int, str]] = []
        self.cond = threading.Condition()

    def deliver(self, src: int, frame: Frame) -> None:
        with self.cond:
            self.frames.append((src, frame, time.monotonic()))
            self.cond.notify_all()

    def on_peer_lost(self, peer: int, reason: str) -> None:
        with self.cond:
            self.lost.append((peer, reason))
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = RECEIVE_WAIT_S) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.frames) >= count, timeout):
                raise TimeoutError(f"rank {ctx.rank} received {len(self.frames)} of {count} frames "
                                   f"within {timeout} s")


def _transport(faults: Faults | None = None):
    inner = PgTransport()
    return FaultyTransport(inner, faults) if faults is not None else inner


def _start(transport, inbox: Inbox) -> None:
    transport.start(ctx.rank, ctx.world_size, ctx.store, inbox.deliver, inbox.on_peer_lost)


def _everyone(step: str) -> None:
    """A store barrier: no rank shuts its transport down before every rank got its frames."""
    ctx.store.set(f"{step}/{ctx.rank}", b"1")
    ctx.store.wait([f"{step}/{p}" for p in range(ctx.world_size)])


def _peers():
    return [p for p in range(ctx.world_size) if p != ctx.rank]


# ------------------------------------------------------------- ordering
def all_to_all_threads(threads: int, frames_per_thread: int) -> dict:
    """``threads`` threads each send ``frames_per_thread`` frames to every peer, interleaving peers.

    Returns, per source, the (thread, seq) sequence as received, plus timings.
    """
    inbox, transport = Inbox(), _transport()
    _start(transport, inbox)
    errors = []

    def sender(thread: int):
        try:
            for seq in range(frames_per_thread):
                for dst in _peers():
                    header = pickle.dumps((ctx.rank, thread, seq))
                    tensors = [torch.tensor([ctx.rank, thread, seq], dtype=torch.int64)]
                    transport.send(dst, Frame(int(Kind.PYTHON_CALL), thread * 1_000_000 + seq, header, tensors))
        except Exception as exc:  # reported, the test fails with it
            errors.append(repr(exc))

    start = time.monotonic()
    workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    expected = threads * frames_per_thread * (ctx.world_size - 1)
    inbox.wait_for(expected)
    elapsed = time.monotonic() - start
    _everyone("received")  # else a peer's early STOP is reported as a lost peer, correctly
    transport.shutdown()
    received = {}
    bad = []
    for src, frame, _ in inbox.frames:
        sender_rank, thread, seq = pickle.loads(frame.header)
        if sender_rank != src or frame.msg_id != thread * 1_000_000 + seq \
                or frame.tensors[0].tolist() != [src, thread, seq]:
            bad.append((src, sender_rank, frame.msg_id, frame.tensors[0].tolist()))
        received.setdefault(src, []).append((thread, seq))
    return {"errors": errors, "bad": bad, "received": received, "elapsed": elapsed,
            "count": len(inbox.frames), "lost": inbox.lost}


class _ReversedBatches(PgTransport):
    """Planted bug: a batch meta carries its frames in reverse order (what the burst clause must catch)."""

    def _flush(self, dst: int) -> None:
        self._outbox[dst].reverse()
        super()._flush(dst)


def burst_mixed(frames: int, every_large: int, planted: bool = False, send_window: int | None = None) -> dict:
    """One thread sends ``frames`` frames back to back to every peer, every ``every_large``-th one too
    large to be inline (it goes alone, after whatever waits in the outbox); returns what each peer's
    frames looked like on arrival and how many meta messages carried them. ``planted``: the sender
    is a transport that reverses each batch; ``send_window``: the transport's, if given."""
    inbox, transport = Inbox(), (_ReversedBatches() if planted else _transport())
    if send_window is not None:
        transport.send_window = send_window
    _start(transport, inbox)
    large = torch.arange(2048, dtype=torch.int32)  # 8 KiB: body and data messages of its own
    for seq in range(frames):
        for dst in _peers():
            tensors = [large + seq] if seq % every_large == every_large - 1 else [torch.tensor([seq, ctx.rank])]
            transport.send(dst, Frame(int(Kind.PYTHON_CALL), seq, pickle.dumps((ctx.rank, seq)), tensors))
    inbox.wait_for(frames * (ctx.world_size - 1))
    metas = transport.state()["metas_received"]  # before the barrier: no peer's STOP can have come yet
    _everyone("received")
    transport.shutdown()
    order, bad = {}, []
    for src, frame, _ in inbox.frames:
        sender, seq = pickle.loads(frame.header)
        expected = (large + seq).tolist() if seq % every_large == every_large - 1 else [seq, src]
        if sender != src or frame.msg_id != seq or frame.tensors[0].tolist() != expected:
            bad.append((src, frame.msg_id))
        order.setdefault(src, []).append(seq)
    return {"order": order, "bad": bad, "metas": metas, "frames": len(inbox.frames), "lost": inbox.lost}


# ------------------------------------------------------------- payloads
def payload_cases() -> list[tuple[str, torch.Tensor]]:
    """Deterministic tensors covering every dtype and awkward layouts; same on every rank."""
    gen = torch.Generator().manual_seed(1234)
    cases = []
    base = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
                  torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
                  torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2):
        if dtype.is_complex:
            value = torch.complex(base, -base).to(dtype)
        elif dtype == torch.bool:
            value = base > 0
        elif dtype.is_floating_point:
            value = base.to(dtype)
        else:
            value = (base * 40).abs().to(torch.int64).to(dtype)
        cases.append((f"{dtype}", value))
    # Every other dtype the transport carries (complex32, the float8 fnuz and e8m0 kinds, ...):
    # random bit patterns, NaNs included, which must arrive bit for bit.
    for dtype in DTYPE_CODES:
        if dtype != torch.bool and f"{dtype}" not in {name for name, _ in cases}:
            raw = torch.randint(0, 256, (3, 4 * dtype.itemsize), generator=gen, dtype=torch.uint8)
            cases.append((f"{dtype} bits", raw.view(dtype)))
    cases += [
        ("0-dim", torch.tensor(3.25)),
        ("0-dim bool", torch.tensor(True)),
        ("empty", torch.empty(0)),
        ("empty 2-d", torch.empty(4, 0, dtype=torch.int32)),
        ("transposed", torch.arange(12.0).reshape(3, 4).t()),
        ("strided", torch.arange(40, dtype=torch.int64)[::3]),
        ("expanded", torch.arange(3.0).expand(4, 3)),
        ("conj view", torch.complex(base, base).conj()),
        ("neg view", torch.complex(base, base).conj().imag),
        ("offset view", torch.arange(20.0)[7:13]),
        ("requires grad", torch.ones(3, requires_grad=True)),
        ("big 16 MiB", torch.arange(4 << 20, dtype=torch.float32)),
    ]
    return cases


def send_payloads(faults: Faults | None = None) -> dict:
    """Every rank sends every payload case to every peer in one frame (the 16 MiB one aside: once is
    enough), and one frame per case; returns the names of cases that arrived different from what was sent."""
    cases = payload_cases()
    bundle = [(name, t) for name, t in cases if not name.startswith("big")]
    inbox, transport = Inbox(), _transport(faults)
    _start(transport, inbox)
    header = pickle.dumps([name for name, _ in bundle])
    for dst in _peers():
        transport.send(dst, Frame(int(Kind.PYTHON_RET), 1, header, [t for _, t in bundle]))
        for index, (_, tensor) in enumerate(cases):
            transport.send(dst, Frame(int(Kind.SCRIPT_RET), 100 + index, b"", [tensor]))
        transport.send(dst, Frame(int(Kind.EXCEPTION), 2, b"no tensors"))
        transport.send(dst, Frame(int(Kind.EXCEPTION), 3, b""))
    inbox.wait_for((len(cases) + 3) * (ctx.world_size - 1))
    _everyone("received")
    transport.shutdown()
    wrong = []
    for src, frame, _ in inbox.frames:
        if frame.msg_id == 1:
            if pickle.loads(frame.header) != [name for name, _ in bundle] or len(frame.tensors) != len(bundle):
                wrong.append((src, "bundle header or count"))
                continue
            pairs = zip(bundle, frame.tensors)
        elif frame.msg_id in (2, 3):
            if frame.tensors or frame.header != (b"no tensors" if frame.msg_id == 2 else b""):
                wrong.append((src, f"frame {frame.msg_id}: {frame.header!r} {len(frame.tensors)} tensors"))
            continue
        else:
            pairs = [(cases[frame.msg_id - 100], frame.tensors[0])]
        for (name, sent), got in pairs:
            if not _same(sent, got):
                wrong.append((src, name, f"sent {sent.dtype} {list(sent.shape)}, got {got.dtype} {list(got.shape)}"))
    return {"wrong": wrong, "count": len(inbox.frames), "kinds": sorted({f.kind for _, f, _ in inbox.frames})}


def torch_rpc_strides(sent: torch.Tensor) -> tuple[int, ...]:
    """The strides torch's RPC delivers ``sent`` with (torch/csrc/distributed/rpc/utils.cpp cloneSparseTensors):
    its own, unless its storage is at least 8 KiB and twice its elements, then those of its clone()."""
    plain = sent.detach().resolve_conj().resolve_neg()
    storage, useful = plain.untyped_storage().nbytes(), plain.numel() * plain.element_size()
    return tuple((plain.clone() if storage >= 8 * 1024 and storage >= 2 * useful else plain).stride())


def _same(sent: torch.Tensor, got: torch.Tensor) -> bool:
    if got.dtype != sent.dtype or got.shape != sent.shape or got.device.type != "cpu":
        return False
    if got.numel() and tuple(got.stride()) != torch_rpc_strides(sent):
        return False
    sent = sent.detach().resolve_conj().resolve_neg()
    # compare bit patterns: NaN-safe and valid for every dtype, float8 included
    as_bytes = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return torch.equal(as_bytes(sent), as_bytes(got))


# ------------------------------------------------------------- shutdown
def idle_shutdown() -> dict:
    """Start, send nothing, shut down: the listener is blocked in a receive from any source."""
    inbox, transport = Inbox(), PgTransport()
    _start(transport, inbox)
    _everyone("started")
    time.sleep(0.05)  # let the listener block in its receive
    start = time.monotonic()
    transport.shutdown()
    elapsed = time.monotonic() - start
    transport.shutdown()  # idempotent
    return {"elapsed": elapsed, "clean": transport.clean_close, "state": transport.state(), "lost": inbox.lost}


def one_rank_leaves_early() -> dict:
    """Rank 0 shuts down while the others keep theirs open (a non-graceful exit).

    Rank 0 must return promptly (the others' listeners answer its STOP); the
    others learn through on_peer_lost that rank 0 is gone, a send to it
    raises TransportError naming it, and traffic among the others still flows.
    """
    from fixtures.rank import ctx as c

    inbox, transport = Inbox(), PgTransport()
    _start(transport, inbox)
    out = {}
    if c.rank == 0:
        start = time.monotonic()
        transport.shutdown()
        out["elapsed"] = time.monotonic() - start
        out["clean"] = transport.clean_close
        out["state"] = transport.state()
        c.store.set("rank0-left", b"1")
        try:
            transport.send(1, Frame(int(Kind.PYTHON_CALL), 9, b"after"))
            out["send_after"] = "sent"
        except TransportError as exc:
            out["send_after"] = str(exc)
    else:
        c.store.wait(["rank0-left"])
        with inbox.cond:
            inbox.cond.wait_for(lambda: inbox.lost, RECEIVE_WAIT_S)
        out["lost"] = list(inbox.lost)
        try:
            transport.send(0, Frame(int(Kind.PYTHON_CALL), 9, b"to the departed"))
            out["send_to_0"] = "sent"
        except TransportError as exc:
            out["send_to_0"] = str(exc)
        others = [p for p in _peers() if p != 0]
        for dst in others:
            transport.send(dst, Frame(int(Kind.PYTHON_CALL), 10, b"still here"))
        inbox.wait_for(len(others))
        out["from"] = sorted(src for src, _, _ in inbox.frames)
        start = time.monotonic()
        transport.shutdown()
        out["elapsed"] = time.monotonic() - start
        out["clean"] = transport.clean_close
    return out


# ------------------------------------------------------------- faults
def faulty_counts(num_fail_sends: int, sends: int) -> dict:
    """PYTHON_CALL fails ``num_fail_sends`` times per distinct message; other kinds pass.

    Every rank sends rank+1-th peer: ``sends`` identical PYTHON_CALLs, one distinct PYTHON_CALL
    per send, and ``sends`` SCRIPT_CALLs. Returns what raised and what arrived.
    """
    faults = Faults(fail=("PYTHON_CALL",), num_fail_sends=num_fail_sends)
    inbox, transport = Inbox(), FaultyTransport(PgTransport(), faults)
    _start(transport, inbox)
    dst = (ctx.rank + 1) % ctx.world_size
    outcome = {"same": [], "distinct": [], "script": []}
    for i in range(sends):
        for label, kind, header in (("same", Kind.PYTHON_CALL, b"same"),
                                    ("distinct", Kind.PYTHON_CALL, f"distinct {i}".encode()),
                                    ("script", Kind.SCRIPT_CALL, b"same")):
            try:
                transport.send(dst, Frame(int(kind), i, header))
                outcome[label].append("sent")
            except TransportError as exc:
                outcome[label].append(f"{type(exc).__name__}: {exc}")
    expected = sum(s == "sent" for results in outcome.values() for s in results)
    ctx.store.set(f"expect/{dst}", str(expected))
    inbox.wait_for(int(ctx.store.get(f"expect/{ctx.rank}")))
    transport.shutdown()
    outcome["arrived"] = sorted((Kind(f.kind).name, f.header.decode(), f.msg_id) for _, f, _ in inbox.frames)
    outcome["failed_sends"] = transport.failed_sends
    return outcome


def faulty_delay(delay: float) -> dict:
    """PYTHON_CALL is delayed ``delay`` s: send() returns at once, the frame arrives late, and a
    SCRIPT_CALL sent right after it overtakes it."""
    faults = Faults(delay={"PYTHON_CALL": delay})
    inbox, transport = Inbox(), FaultyTransport(PgTransport(), faults)
    _start(transport, inbox)
    dst = (ctx.rank + 1) % ctx.world_size
    ctx.store.set(f"ready/{ctx.rank}", b"1")
    ctx.store.wait([f"ready/{p}" for p in range(ctx.world_size)])
    sent_at = time.monotonic()
    transport.send(dst, Frame(int(Kind.PYTHON_CALL), 1, b"delayed"))
    send_returned = time.monotonic() - sent_at
    transport.send(dst, Frame(int(Kind.SCRIPT_CALL), 2, b"prompt"))
    inbox.wait_for(2)
    arrivals = [(Kind(f.kind).name, at) for _, f, at in inbox.frames]
    _everyone("received")  # a frame still delayed at shutdown is dropped
    transport.shutdown()
    # arrival relative to our own send: ranks share the machine's monotonic clock
    return {"send_returned": send_returned, "order": [name for name, _ in arrivals],
            "sent_at": sent_at, "arrived_at": dict(arrivals), "delayed_sends": transport.delayed_sends}


# ------------------------------------------------------------- end to end
def _start_agent(agent: str, faults: Faults | None = None, rpc_timeout: float = 20.0):
    from backends import rpc_agents

    return rpc_agents.start_agent(agent, rank=ctx.rank, world_size=ctx.world_size, store=ctx.store,
                                  init_file="", rpc_timeout=rpc_timeout, faults=faults)


def _worker(rank: int) -> str:
    from backends.rpc_agents import worker_name

    return worker_name(rank % ctx.world_size)


def add_on(tensor: torch.Tensor, value) -> torch.Tensor:
    """A UDF that runs on the callee: returns tensor + value and says where it ran."""
    return tensor + value


def rank_and_payload(payload):
    return ctx.rank, payload


def end_to_end(agent: str = "reference-pg") -> dict:
    """rpc_sync, rpc_async and remote to the next rank (and to self) through the reference agent."""
    rpc = _start_agent(agent)
    try:
        nxt = _worker(ctx.rank + 1)
        t = torch.arange(6.0).reshape(2, 3)
        out = {
            "sync": rpc.rpc_sync(nxt, torch.add, args=(t, ctx.rank)).tolist(),
            "async": rpc.rpc_async(nxt, add_on, args=(t.t(), 10)).wait().tolist(),
            "remote": rpc.remote(nxt, add_on, args=(torch.ones(2, dtype=torch.bfloat16), 1)).to_here().tolist(),
            "self": rpc.rpc_sync(_worker(ctx.rank), rank_and_payload, args=("me",)),
            "where": rpc.rpc_sync(nxt, rank_and_payload, args=({"nested": [torch.tensor([1 + 2j])]},)),
        }
        out["where"] = (out["where"][0], out["where"][1]["nested"][0].tolist())
        try:
            rpc.rpc_sync(nxt, add_on, args=("not a tensor", 1))
            out["error"] = None
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        rpc.shutdown()
    return out


def many_async(per_peer: int, agent: str = "reference-pg") -> dict:
    """``per_peer`` rpc_async calls from this rank to every rank (itself included), all in flight at once."""
    rpc = _start_agent(agent)
    start = time.monotonic()
    try:
        futures = [(dst, i, rpc.rpc_async(_worker(dst), add_on, args=(torch.full((4,), float(i)), ctx.rank)))
                   for i in range(per_peer) for dst in range(ctx.world_size)]
        wrong = [(dst, i) for dst, i, fut in futures if fut.wait().tolist() != [float(i + ctx.rank)] * 4]
        elapsed = time.monotonic() - start
    finally:
        rpc.shutdown()
    return {"calls": len(futures), "wrong": wrong, "elapsed": elapsed}


def faulty_end_to_end(agent: str = "reference-pg") -> dict:
    """With PYTHON_CALL failing twice per message, the first two identical rpc_syncs fail with torch's text
    and the third succeeds; a delayed PYTHON_REMOTE_CALL still completes."""
    faults = Faults(fail=("PYTHON_CALL",), num_fail_sends=2, delay={"PYTHON_REMOTE_CALL": 0.2})
    rpc = _start_agent(agent, faults=faults)
    out = []
    try:
        nxt = _worker(ctx.rank + 1)
        for _ in range(3):
            try:
                out.append(rpc.rpc_sync(nxt, add_on, args=(torch.ones(1), 1)).tolist())
            except Exception as exc:
                out.append(str(exc))
        start = time.monotonic()
        remote = rpc.remote(nxt, add_on, args=(torch.ones(1), 2)).to_here().tolist()
        remote_s = time.monotonic() - start
    finally:
        rpc.shutdown()
    return {"calls": out, "remote": remote, "remote_s": remote_s}


# ------------------------------------------------------------- measuring (printed, never asserted)
def ping_pong(rounds: int, header_bytes: int = 200, tensor_elems: int = 16) -> dict:
    """Rank 0 sends a frame to rank 1, which sends it back, ``rounds`` times; returns the p50 round trip."""
    inbox, transport = Inbox(), PgTransport()
    _start(transport, inbox)
    header = b"h" * header_bytes
    tensors = [torch.ones(tensor_elems)] if tensor_elems else []
    times = []
    if ctx.rank in (0, 1):
        other = 1 - ctx.rank
        for i in range(rounds):
            start = time.monotonic()
            if ctx.rank == 0:
                transport.send(other, Frame(int(Kind.PYTHON_CALL), i, header, tensors))
                inbox.wait_for(i + 1)
            else:
                inbox.wait_for(i + 1)
                transport.send(other, Frame(int(Kind.PYTHON_RET), i, header, tensors))
            times.append(time.monotonic() - start)
    _everyone("pingpong-done")
    transport.shutdown()
    times.sort()
    return {"p50_us": times[len(times) // 2] * 1e6 if times else None}


def restart_cycles(cycles: int) -> dict:
    """Start and shut down a transport ``cycles`` times, one frame each way each time; returns how many
    process groups and threads this rank had before and after (a clean close frees its group)."""
    import torch.distributed.distributed_c10d as c10d

    groups_before, threads_before = len(c10d._world.pg_map), threading.active_count()
    received = 0
    for cycle in range(cycles):
        inbox, transport = Inbox(), PgTransport()
        _start(transport, inbox)
        for dst in _peers():
            transport.send(dst, Frame(int(Kind.PYTHON_CALL), cycle, b"cycle"))
        inbox.wait_for(len(_peers()))
        received += len(inbox.frames)
        _everyone(f"cycle{cycle}")
        transport.shutdown()
    time.sleep(0.2)  # let finished threads go
    return {"groups": (groups_before, len(c10d._world.pg_map)), "threads": (threads_before, threading.active_count()),
            "received": received}


def call_after_peer_left(agent: str = "reference-pg") -> dict:
    """Rank 1 shuts its agent down without the graceful handshake; rank 0 then calls it and gets an
    error naming it promptly (not at rpc_timeout); rank 0's own shutdown stays bounded."""
    rpc = _start_agent(agent, rpc_timeout=20.0)
    out = {}
    if ctx.rank == 1:
        start = time.monotonic()
        rpc.shutdown(graceful=False)
        out["shutdown_s"] = time.monotonic() - start
        ctx.store.set("left", b"1")
        return out
    try:
        if ctx.rank == 0:
            ctx.store.wait(["left"])
            start = time.monotonic()
            try:
                rpc.rpc_sync(_worker(1), add_on, args=(torch.ones(1), 1))
                out["error"] = None
            except Exception as exc:
                out["error"] = str(exc)
            out["error_s"] = time.monotonic() - start
    finally:
        start = time.monotonic()
        rpc.shutdown(graceful=False)
        out["shutdown_s"] = time.monotonic() - start
    return out


def echo_from_deliver(count: int, recv_depth: int = PgTransport.recv_depth) -> dict:
    """Every rank sends ``count`` frames to every peer, and deliver() itself answers each with an echo,
    on the listener thread, as an agent completing a future from deliver() does. All listeners answer
    at once: a transport that waited there for its answers to be taken would deadlock."""
    inbox, transport = Inbox(), PgTransport()
    transport.recv_depth = recv_depth  # 1: every receive the listener posts is used up at once
    echoes = []

    def deliver(src, frame):
        if frame.kind == int(Kind.PYTHON_CALL):
            transport.send(src, Frame(int(Kind.PYTHON_RET), frame.msg_id, frame.header, frame.tensors))
        else:
            inbox.deliver(src, frame)
            echoes.append((src, frame.msg_id, frame.tensors[0].tolist()))

    transport.start(ctx.rank, ctx.world_size, ctx.store, deliver, inbox.on_peer_lost)
    for i in range(count):
        for dst in _peers():
            transport.send(dst, Frame(int(Kind.PYTHON_CALL), i, b"echo me", [torch.tensor([ctx.rank, dst, i])]))
    inbox.wait_for(count * len(_peers()))
    _everyone("echoed")
    transport.shutdown()
    wrong = [e for e in echoes if e[2] != [ctx.rank, e[0], e[1]]]
    return {"echoes": len(echoes), "wrong": wrong, "clean": transport.clean_close}
