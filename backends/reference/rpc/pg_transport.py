"""RPC frames over the c10d process group under test (agent ``reference-pg``).

The design is PyTorch's ProcessGroupAgent (removed in 1.9): every message is
tagged send/recv on a process group, and one listener thread per rank
receives from any source. Here the group is created collectively in
``start()`` with ``dist.new_group`` on the default group's backend, so RPC
traffic never shares tags with the default group and the backend under test
(gloo, the project's ``reference``, a vendor's) carries every byte.

One frame is, in this order, from one sender to one receiver:

1. ``META_TAG``: a uint8 tensor of ``META_BYTES`` (4 KiB): eight int64 fields
   ``[MAGIC, kind, msg_id, header_len, n_tensors, desc_len, inline, 0]``
   then room for a whole small frame. It has the same size for every frame,
   so the listener can keep ``RECV_DEPTH`` receives from any source posted
   for it (and it is never empty: gloo cannot receive an empty tensor from
   any source). When
   the header, the tensor descriptors (per tensor int64 ``dtype code, ndim,
   *shape``) and the tensor bytes fit, they follow the fields and the frame
   is this one message (``inline = 1``): a typical RPC costs one c10d
   message, not three;
2. otherwise ``BODY_TAG``, from that sender by name: a uint8 tensor holding
   the header followed by the descriptors; skipped when both are empty;
3. ``BODY_TAG``: each non-empty tensor's bytes as a flat uint8 tensor (a
   contiguous copy when needed), so every dtype travels whatever the backend
   supports natively; empty tensors send nothing.

Frames to one peer never interleave: all messages of a frame are posted under
that peer's lock (posting does not block; completion is awaited outside the
lock), and c10d keeps messages of one tag between one pair in order. send()
returns once its messages are posted; a completer thread awaits them in
posting order (on gloo a send completes only when the receiver takes it: a
caller that waited for that would pay the rendezvous on every frame). What
is posted and not yet taken is bounded (``MAX_INFLIGHT_FRAMES``,
``MAX_INFLIGHT_BYTES``): beyond it send() waits, except on the listener
thread (an agent answering from deliver()), whose frames are what frees a
peer's credit. A send that cannot be posted raises TransportError naming
the peer; one that fails after send() returned loses the peer through
``on_peer_lost`` (and later sends to it raise).

Shutdown is a close handshake per direction, like TCP's FIN: ``shutdown()``
sends a STOP frame (``kind = STOP_KIND``, never delivered) to every peer; a
listener that receives STOP from a peer answers with its own STOP unless it
already sent one, and stops sending to that peer. A listener exits once every
peer's STOP arrived, i.e. after it has drained every peer's stream, so its
last pending receive-from-any-source is always satisfied by a real message
(c10d offers no way to cancel it: torch's Work has no abort in Python, and a
gloo wait that times out poisons the whole gloo context). A rank that shuts
down while its peers keep running therefore still returns promptly: their
listeners answer. After a clean close (every STOP exchanged both ways) the
transport destroys its group, so agents restarted in one process leave no
sockets or threads behind.

A peer process that dies is noticed at the next send to it (gloo and the
reference backend both fail that send, naming the closed connection): the
send raises TransportError naming the rank and ``on_peer_lost`` fires. c10d
fails a receive from any source for nobody, so the listener cannot notice a
death by itself; a dead peer counts as closed for shutdown, which then
returns at once and reports (in a warning, ``clean_close = False``) the
listener left blocked in its receive; the group is then left as it is.
Every other wait of a shutdown is bounded by ``SHUTDOWN_JOIN_S``.

Limits (capabilities, stated as errors): frames carry CPU tensors; a default
group whose backend cannot move CPU tensors (nccl) is refused in ``start()``
with an error that says so. Self-sends never reach a transport (the agent
short-circuits them), which matters because gloo cannot send to its own rank.
"""

from __future__ import annotations

import collections
import logging
import queue
import struct
import threading
import time
from datetime import timedelta

import numpy
import torch
import torch.distributed as dist

from .transport import Frame, Transport, TransportError

log = logging.getLogger(__name__)

MAGIC = 0x52504346  # "RPCF": a receiver that reads anything else has lost the stream
# Every frame starts with a meta message of this fixed size (a receive from any source
# must know its size): 8 int64 fields, then room for a whole small frame.
META_BYTES = 4096
_FIELDS = struct.Struct("<8q")
FIELDS_BYTES = _FIELDS.size
INLINE_CAPACITY = META_BYTES - FIELDS_BYTES
META_TAG = 7001
BODY_TAG = 7002
STOP_KIND = -1  # transport control frame: "no more frames from me to you"
SHUTDOWN_JOIN_S = 10.0  # bound of a shutdown whose peers do not answer
LAST_STOP_GRACE_S = 0.5  # the listener's last steps after the last STOP arrived
START_TIMEOUT_S = 60.0
RECV_DEPTH = 8  # receives from any source kept posted by the listener
# Frames posted and not yet taken by their receivers, at most (one frame always passes).
MAX_INFLIGHT_FRAMES = 256
MAX_INFLIGHT_BYTES = 64 << 20
# The listener waits for its next frame for as long as the agent lives: an idle agent is
# not an error. c10d has one timeout per group, so the group gets a very long one
# (after every rank is known to be present, see start()).
# 7 days: well inside the int32 milliseconds some backends keep. An agent idle longer than
# that loses its listener (the receive times out) and reports every peer lost.
IDLE_TIMEOUT = timedelta(days=7)
MAX_HEADER = 1 << 31
MAX_TENSORS = 1 << 20
MAX_NDIM = 64

# Wire codes of dtypes. Append only (a code is an index here); names missing from this
# torch build are skipped without shifting the others.
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128",
    "uint8", "int8", "int16", "int32", "int64", "bool", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
)
DTYPE_CODES: dict[torch.dtype, int] = {
    getattr(torch, name): code for code, name in enumerate(_DTYPE_NAMES) if hasattr(torch, name)
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


class FrameError(TransportError):
    """A frame received from a peer is malformed: that peer's stream cannot be trusted."""


# --------------------------------------------------------------- encoding
def _tensor_bytes(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """The tensor's elements as a flat contiguous uint8 tensor (a view when already contiguous)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"frame tensor {index} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.device.type != "cpu":
        raise ValueError(f"frame tensor {index} is on {tensor.device}; the reference-pg transport carries "
                         "CPU tensors only (move it to the CPU first)")
    if tensor.layout != torch.strided:
        raise ValueError(f"frame tensor {index} has layout {tensor.layout}; only dense (strided) tensors travel")
    if tensor.dtype not in DTYPE_CODES:
        raise ValueError(f"frame tensor {index} has dtype {tensor.dtype}, which the reference-pg transport "
                         f"cannot carry; supported: {', '.join(str(d) for d in DTYPE_CODES)}")
    # A conjugated or negated view keeps its pending bit through contiguous(): resolve it,
    # or the receiver gets the un-conjugated values.
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8)


def encode(frame: Frame, kind: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """(meta, body or None, data tensors) of one frame; raises on anything that cannot travel.

    A frame whose header, descriptors and tensor bytes fit in ``INLINE_CAPACITY`` travels
    inline, in the meta message alone (body None, no data tensors): one message instead of
    up to 2 + n_tensors, which is what an RPC's latency over a c10d backend is made of.
    """
    kind = frame.kind if kind is None else kind
    header = frame.header
    if not isinstance(header, (bytes, bytearray, memoryview)):
        raise TypeError(f"frame header must be bytes, got {type(header).__name__}")
    header = bytes(header)
    for name, value in (("kind", kind), ("msg_id", frame.msg_id)):
        if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"frame {name} must be an int64, got {value!r}")
    tensors = list(frame.tensors)
    desc: list[int] = []
    datas: list[torch.Tensor] = []
    for index, tensor in enumerate(tensors):
        data = _tensor_bytes(tensor, index)
        desc += [DTYPE_CODES[tensor.dtype], tensor.dim(), *tensor.shape]
        if data.numel():
            datas.append(data)
    payload = header + struct.pack(f"<{len(desc)}q", *desc)
    desc_len = len(payload) - len(header)
    inline = len(payload) + sum(data.numel() for data in datas) <= INLINE_CAPACITY
    # zeros, not empty: the unused tail of a meta must not carry stale process memory
    meta = torch.zeros(META_BYTES, dtype=torch.uint8)
    view = meta.numpy()
    view[:FIELDS_BYTES] = numpy.frombuffer(
        _FIELDS.pack(MAGIC, kind, frame.msg_id, len(header), len(tensors), desc_len, int(inline), 0), numpy.uint8)
    if not inline:
        body = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else None
        return meta, body, datas
    at = FIELDS_BYTES + len(payload)
    view[FIELDS_BYTES:at] = numpy.frombuffer(payload, numpy.uint8)
    for data in datas:
        meta[at:at + data.numel()].copy_(data)
        at += data.numel()
    return meta, None, []


def decode_meta(fields: bytes, src: int) -> tuple[int, int, int, int, int, bool]:
    """(kind, msg_id, header_len, n_tensors, desc_len, inline) from a meta's first FIELDS_BYTES."""
    magic, kind, msg_id, header_len, n_tensors, desc_len, inline, _ = _FIELDS.unpack(fields[:FIELDS_BYTES])
    if magic != MAGIC:
        raise FrameError(f"frame from rank {src} starts with {magic:#x}, not the magic {MAGIC:#x}")
    if not (0 <= header_len <= MAX_HEADER and 0 <= n_tensors <= MAX_TENSORS and 0 <= desc_len <= MAX_HEADER
            and inline in (0, 1)):
        raise FrameError(f"frame from rank {src} has impossible fields: header {header_len} bytes, "
                         f"{n_tensors} tensors, descriptors {desc_len} bytes, inline flag {inline}")
    if inline and header_len + desc_len > INLINE_CAPACITY:
        raise FrameError(f"frame from rank {src}: an inline frame of {header_len + desc_len} bytes does not fit "
                         f"the {INLINE_CAPACITY} inline bytes")
    return kind, msg_id, header_len, n_tensors, desc_len, bool(inline)


def decode_inline_tensors(raw: bytes, descs, src: int) -> list[torch.Tensor]:
    """The tensors of an inline frame from the bytes after its header and descriptors."""
    tensors, at = [], 0
    for dtype, shape in descs:
        tensor = torch.empty(shape, dtype=dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes:
            if at + nbytes > len(raw):
                raise FrameError(f"frame from rank {src}: inline tensor data ends after {len(raw)} bytes")
            tensor = torch.frombuffer(bytearray(raw[at:at + nbytes]), dtype=torch.uint8).view(dtype).reshape(shape)
            at += nbytes
        tensors.append(tensor)
    return tensors


def decode_descriptors(desc: bytes, n_tensors: int, src: int) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    if len(desc) % 8:
        raise FrameError(f"frame from rank {src}: descriptors of {len(desc)} bytes are not int64s")
    words = struct.unpack(f"<{len(desc) // 8}q", desc)
    out, at = [], 0
    for index in range(n_tensors):
        if at + 2 > len(words):
            raise FrameError(f"frame from rank {src}: descriptor of tensor {index} is missing")
        code, ndim = words[at], words[at + 1]
        if code not in CODE_DTYPES or not 0 <= ndim <= MAX_NDIM or at + 2 + ndim > len(words):
            raise FrameError(f"frame from rank {src}: tensor {index} has dtype code {code}, ndim {ndim}")
        shape = tuple(words[at + 2: at + 2 + ndim])
        if any(d < 0 for d in shape):
            raise FrameError(f"frame from rank {src}: tensor {index} has a negative size in {list(shape)}")
        out.append((CODE_DTYPES[code], shape))
        at += 2 + ndim
    if at != len(words):
        raise FrameError(f"frame from rank {src}: {len(words) - at} stray descriptor words")
    return out


def read_frame(raw: bytes, src: int, receive) -> Frame | None:
    """The frame whose meta message is ``raw``; ``receive(nbytes)`` returns the next BODY_TAG
    message from ``src`` as a uint8 tensor. None for a STOP frame."""
    kind, msg_id, header_len, n_tensors, desc_len, inline = decode_meta(raw, src)
    if inline:
        payload = raw[FIELDS_BYTES:FIELDS_BYTES + header_len + desc_len]
    elif header_len + desc_len:
        payload = receive(header_len + desc_len).numpy().tobytes()
    else:
        payload = b""
    header, desc = payload[:header_len], payload[header_len:]
    descs = decode_descriptors(desc, n_tensors, src)
    if inline:
        tensors = decode_inline_tensors(raw[FIELDS_BYTES + header_len + desc_len:], descs, src)
    else:
        tensors = []
        for dtype, shape in descs:
            tensor = torch.empty(shape, dtype=dtype)
            if tensor.numel():
                tensor = receive(tensor.numel() * tensor.element_size()).view(dtype).reshape(shape)
            tensors.append(tensor)
    if kind == STOP_KIND:
        return None
    return Frame(kind=kind, msg_id=msg_id, header=header, tensors=tensors)


def check_backend_carries_cpu(backend: str) -> None:
    """Refuse a backend that cannot send CPU tensors (nccl), before any collective call."""
    devices = dist.Backend.backend_capability.get(str(backend).lower())
    if devices is not None and "cpu" not in devices:
        raise RuntimeError(f"the reference-pg RPC transport sends CPU tensors, and the backend {backend!r} "
                           f"only moves tensors on {devices} (nccl: CUDA only); run reference-pg over a "
                           "backend with CPU support, or use the reference-tp agent")


# --------------------------------------------------------------- transport
class PgTransport(Transport):
    name = "reference-pg"
    shutdown_join_s = SHUTDOWN_JOIN_S
    recv_depth = RECV_DEPTH

    def __init__(self) -> None:
        self._group = None
        self._rank = -1
        self._world_size = 0
        self._deliver = None
        self._on_peer_lost = None
        self._listener: threading.Thread | None = None
        self._state = threading.Lock()  # guards the sets and flags below
        self._dst_locks: dict[int, threading.Lock] = {}
        self._stop_sent: set[int] = set()  # peers we sent STOP: nothing more goes to them
        self._stop_received: set[int] = set()  # peers whose stream is drained
        self._closed_reason: dict[int, str] = {}  # peer -> why send() refuses it
        self._stop_works: list = []
        self._shutting_down = False
        self._dropping = False  # shutdown returned: nothing is delivered any more
        self._listener_error: str | None = None
        self._group_destroyed = False
        self.clean_close: bool | None = None  # set by shutdown(): every STOP exchanged, group destroyed
        self._completions: queue.SimpleQueue | None = None  # posted sends, awaited by the completer
        self._credits = _Credits(MAX_INFLIGHT_FRAMES, MAX_INFLIGHT_BYTES)
        self._completion_thread: threading.Thread | None = None
        self.frames_received = 0

    # ------------------------------------------------------------ start
    def start(self, rank, world_size, store, deliver, on_peer_lost) -> None:
        if not dist.is_initialized():
            raise RuntimeError("the reference-pg RPC transport carries frames over torch.distributed's default "
                               "process group (the backend under test); call dist.init_process_group before "
                               "init_rpc")
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise ValueError(f"RPC rank {rank} of {world_size} differs from the default process group's rank "
                             f"{dist.get_rank()} of {dist.get_world_size()}; reference-pg needs them equal")
        self._rank, self._world_size = rank, world_size
        self._deliver, self._on_peer_lost = deliver, on_peer_lost
        self._dst_locks = {peer: threading.Lock() for peer in self._peers()}
        self._rendezvous(store)
        backend = dist.get_backend()
        check_backend_carries_cpu(backend)
        # Every rank is present (the rendezvous said so), so the long idle timeout cannot
        # turn a missing rank into a days-long hang in new_group's own barrier.
        group = dist.new_group(backend=backend, timeout=IDLE_TIMEOUT)
        self._group = group
        self._listener = threading.Thread(target=self._listen, name=f"reference-pg-listener-r{rank}", daemon=True)
        self._listener.start()

    def _peers(self) -> list[int]:
        return [peer for peer in range(self._world_size) if peer != self._rank]

    def _rendezvous(self, store) -> None:
        """Every rank announces itself in the agent's store; a missing rank is named, not waited on forever."""
        store.set(f"reference-pg/present/{self._rank}", b"1")
        keys = [f"reference-pg/present/{peer}" for peer in self._peers()]
        try:
            store.wait(keys, timedelta(seconds=START_TIMEOUT_S))
        except Exception as exc:
            missing = [peer for peer, key in zip(self._peers(), keys) if not store.check([key])]
            raise TransportError(f"reference-pg transport of rank {self._rank}: ranks {missing} did not start "
                                 f"within {START_TIMEOUT_S:.0f} s ({exc})") from None

    # ------------------------------------------------------------ send
    def send(self, dst: int, frame: Frame) -> None:
        if dst == self._rank or not 0 <= dst < self._world_size:
            raise ValueError(f"reference-pg transport of rank {self._rank}: cannot send to rank {dst} "
                             f"(peers are {self._peers()}; the agent handles self-sends)")
        if not isinstance(frame, Frame):
            raise TypeError(f"reference-pg sends transport.Frame objects, got {type(frame).__name__}")
        if frame.kind == STOP_KIND:
            raise ValueError(f"frame kind {STOP_KIND} is reserved for the transport's STOP frame")
        meta, body, datas = encode(frame)
        nbytes = META_BYTES + (body.numel() if body is not None else 0) + sum(d.numel() for d in datas)
        # The listener never waits for credit: its frames (answers sent from deliver()) are
        # what frees the peer's credit, and the peer's listener ours.
        self._credits.acquire(nbytes, wait=threading.current_thread() is not self._listener)
        try:
            works, keep = self._post(dst, meta, body, datas)
        except BaseException:
            self._credits.release(nbytes)
            raise
        self._completer().put((dst, works, keep, nbytes))

    def _completer(self) -> queue.SimpleQueue:
        with self._state:
            if self._completions is None:
                self._completions = queue.SimpleQueue()
                self._completion_thread = threading.Thread(
                    target=self._complete_loop, args=(self._completions,), daemon=True,
                    name=f"reference-pg-completions-r{self._rank}")
                self._completion_thread.start()
            return self._completions

    def _complete_loop(self, completions: queue.SimpleQueue) -> None:
        """Wait, in posting order, for the sends to complete; a failure loses the peer."""
        while True:
            item = completions.get()
            if item is None:
                return
            dst, works, keep, nbytes = item
            try:
                self._await(dst, works, keep)
            except TransportError:
                pass  # _await told the agent through on_peer_lost
            finally:
                del keep, item
                self._credits.release(nbytes)

    def _post(self, dst: int, meta, body, datas, stop: bool = False):
        """Post every message of one frame under ``dst``'s lock; returns (works, tensors to keep alive)."""
        with self._dst_locks[dst]:
            with self._state:
                # A STOP still goes to a peer that closed its side: it is the answer it waits for.
                reason = None if stop else self._closed_reason.get(dst)
                if reason is None and self._group is None:
                    reason = "the transport is not started"
                if reason is None and dst in self._stop_sent:
                    reason = "this rank's transport is shut down"
                if stop and reason is None:
                    self._stop_sent.add(dst)
            if reason is not None:
                raise TransportError(f"reference-pg: cannot send to rank {dst}: {reason}")
            keep = [meta, body, *datas]
            works = []
            try:
                works.append(self._group.send([meta], dst, META_TAG))
                if body is not None:
                    works.append(self._group.send([body], dst, BODY_TAG))
                for data in datas:
                    works.append(self._group.send([data], dst, BODY_TAG))
            except Exception as exc:
                # Part of a frame may be posted: the stream to dst is unusable from here on.
                self._lose(dst, f"posting a frame to rank {dst} failed: {exc}")
                raise TransportError(f"reference-pg: cannot send to rank {dst}: {exc}") from exc
            return works, keep

    def _await(self, dst: int, works, keep) -> None:
        try:
            for work in works:
                work.wait()
        except Exception as exc:
            reason = f"sending a frame to rank {dst} over {dist.get_backend(self._group)} failed: {exc}"
            self._lose(dst, reason)
            raise TransportError(f"reference-pg: cannot send to rank {dst}: {reason}") from exc
        del keep  # the tensors were referenced until every send completed

    def _lose(self, peer: int, reason: str) -> None:
        """Mark ``peer`` unreachable (once) and tell the agent, unless we are the ones shutting down."""
        with self._state:
            if peer in self._closed_reason:
                return
            self._closed_reason[peer] = reason
            quiet = self._shutting_down
        if not quiet:
            self._on_peer_lost(peer, reason)

    # ------------------------------------------------------------ receive
    def _listen(self) -> None:
        group = self._group
        # RECV_DEPTH receives from any source stay posted, so the backend can match an
        # incoming frame at once (gloo hands a send over only once a receive is posted, a
        # rendezvous its own threads then finish without us). The backend matches them in
        # the order they were posted, and we take them in that order: per-peer order holds.
        posted = collections.deque()
        try:
            for _ in range(self.recv_depth):
                meta = torch.zeros(META_BYTES, dtype=torch.uint8)
                posted.append((meta, group.recv_anysource([meta], META_TAG)))
        except Exception as exc:
            self._listener_failed(f"posting a receive from any rank failed: {exc}")
            return
        while True:
            try:
                meta, work = posted.popleft()
                work.wait()
                src = work._source_rank()
                raw = meta.numpy().tobytes()  # a copy: the buffer is posted again right away
                posted.append((meta, group.recv_anysource([meta], META_TAG)))
            except Exception as exc:
                self._listener_failed(f"receiving from any rank failed: {exc}")
                return
            try:
                frame = self._read_rest(group, src, raw)
            except FrameError as exc:
                # That peer's stream is garbled; others keep working.
                self._lose(src, str(exc))
                with self._state:
                    self._stop_received.add(src)
                if self._all_peers_done():
                    return
                continue
            except Exception as exc:
                self._listener_failed(f"receiving a frame from rank {src} failed: {exc}")
                return
            if frame is None:  # STOP
                if self._peer_stopped(src):
                    return
                continue
            self.frames_received += 1
            if self._dropping:
                continue
            try:
                self._deliver(src, frame)
            except Exception:  # the agent's bug must not kill the only receiver
                log.exception("reference-pg: deliver() raised for a frame from rank %d", src)

    def _read_rest(self, group, src: int, raw: bytes) -> Frame | None:
        def receive(nbytes: int) -> torch.Tensor:
            buffer = torch.empty(nbytes, dtype=torch.uint8)
            group.recv([buffer], src, BODY_TAG).wait()
            return buffer

        return read_frame(raw, src, receive)

    def _peer_stopped(self, src: int) -> bool:
        """``src`` sent its last frame to us. Answer with our STOP; True when every peer is done."""
        with self._state:
            self._stop_received.add(src)
            was_shutting_down = self._shutting_down
            self._closed_reason.setdefault(src, f"rank {src} has shut down its RPC transport")
        if not was_shutting_down:
            self._on_peer_lost(src, f"rank {src} has shut down its RPC transport")
        # Posting does not block (the peer's listener is waiting for exactly this frame), so
        # the listener answers itself; shutdown() awaits the work.
        self._post_stop(src)
        return self._all_peers_done()

    def _post_stop(self, dst: int) -> None:
        meta, _, _ = encode(Frame(STOP_KIND, 0, b""), kind=STOP_KIND)
        with self._state:
            if dst in self._stop_sent:
                return
        try:
            works, keep = self._post(dst, meta, None, [], stop=True)
        except TransportError:
            return  # the peer is unreachable: it needs no STOP from us
        with self._state:
            self._stop_works.append((dst, works, keep))

    def _all_peers_done(self) -> bool:
        """Every peer either closed its stream (STOP) or is lost: nothing more can come."""
        with self._state:
            return self._stop_received.union(self._closed_reason).issuperset(self._peers())

    def _listener_failed(self, reason: str) -> None:
        """The only receiver is gone: no response from any peer can arrive, so every peer is lost."""
        with self._state:
            self._listener_error = reason
            expected = self._shutting_down and self._stop_received.issuperset(self._peers())
        if expected:
            return
        for peer in self._peers():
            self._lose(peer, f"the reference-pg listener of rank {self._rank} stopped: {reason}")

    # ------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        with self._state:
            if self._shutting_down:
                return
            self._shutting_down = True
            started = self._group is not None
        if not started:
            self._dropping = True
            return
        if threading.current_thread() is self._listener:
            # Shut down from inside deliver(): the listener cannot wait for itself. It sends our
            # STOPs now and exits by itself once every peer's STOP arrived.
            for peer in self._peers():
                self._post_stop(peer)
            self._dropping = True
            self.clean_close = False
            return
        for peer in self._peers():
            self._post_stop(peer)
        problems = []
        # The listener exits on the last STOP. Once every peer is accounted for, a listener
        # still blocked waits for a peer that was lost (dead: c10d fails a receive from
        # any source for nobody), and no frame will ever wake it: do not wait out the bound.
        deadline = time.monotonic() + self.shutdown_join_s
        while self._listener.is_alive() and time.monotonic() < deadline:
            if self._all_peers_done():
                self._listener.join(LAST_STOP_GRACE_S)
                break
            self._listener.join(0.05)
        if self._listener.is_alive():
            with self._state:
                waiting = sorted(set(self._peers()) - self._stop_received)
                lost = {peer: self._closed_reason[peer] for peer in waiting if peer in self._closed_reason}
            problems.append(f"its listener stays blocked in a receive from any source: no STOP from ranks "
                            f"{waiting}" + (f" (lost: {lost})" if lost else ""))
        with self._state:
            stop_works = list(self._stop_works)
            completions, completer = self._completions, self._completion_thread
        if completions is not None:  # every peer is closed for sending: finish what was posted
            completions.put(None)
            completer.join(max(0.0, deadline - time.monotonic()))
            if completer.is_alive():
                problems.append("frames posted before the STOPs were not taken")
        if not _wait_all([w for _, works, _ in stop_works for w in works], max(0.0, deadline - time.monotonic())):
            problems.append(f"STOP frames to some peers were not taken within {self.shutdown_join_s:g} s")
        self._dropping = True
        if problems:
            # The group stays as it is: destroying it under a pending receive is undefined
            # in c10d backends. It goes with the next destroy_process_group().
            log.warning("reference-pg transport of rank %d shut down without a clean close: %s",
                        self._rank, "; ".join(problems))
            self.clean_close = False
        else:
            self.clean_close = True
            # Every stream is drained both ways and no work of ours is pending, so the group
            # can go: an agent restarted many times in one process must not pile up groups
            # (each holds sockets and threads). Peers still closing are unaffected: their
            # pending receive is from any source, which no backend fails for one closed pair.
            self._destroy_group()

    def _destroy_group(self) -> None:
        group, self._group_destroyed = self._group, True
        try:
            if dist.is_initialized() and group in dist.distributed_c10d._world.pg_map:
                dist.destroy_process_group(group)
        except Exception as exc:  # the default group went first (process teardown): nothing to free
            log.debug("reference-pg: destroying the transport group failed: %s", exc)

    # for tests: where the transport stands
    def state(self) -> dict:
        with self._state:
            return {"stop_sent": sorted(self._stop_sent), "stop_received": sorted(self._stop_received),
                    "closed": dict(self._closed_reason), "listener_error": self._listener_error,
                    "listener_alive": bool(self._listener and self._listener.is_alive()),
                    "frames_received": self.frames_received, "group_destroyed": self._group_destroyed}


class _Credits:
    """Bounds what send() has posted and the receivers have not taken yet: backpressure
    without making every caller wait for its own frame's rendezvous."""

    def __init__(self, max_frames: int, max_bytes: int):
        self._cond = threading.Condition()
        self._max_frames, self._max_bytes = max_frames, max_bytes
        self.frames = self.bytes = 0

    def _fits(self, nbytes: int) -> bool:
        return self.frames == 0 or (self.frames < self._max_frames and self.bytes + nbytes <= self._max_bytes)

    def acquire(self, nbytes: int, wait: bool = True) -> None:
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: self._fits(nbytes))
            self.frames += 1
            self.bytes += nbytes

    def release(self, nbytes: int) -> None:
        with self._cond:
            self.frames -= 1
            self.bytes -= nbytes
            self._cond.notify_all()


def _wait_all(works, timeout: float) -> bool:
    """Wait for c10d works with a bound, without a c10d timeout (a gloo wait that times
    out poisons the group): a helper thread waits, we join it."""
    if not works:
        return True
    errors = []

    def wait():
        for work in works:
            try:
                work.wait()
            except Exception as exc:  # a peer gone at shutdown is not our problem
                errors.append(exc)

    waiter = threading.Thread(target=wait, name="reference-pg-shutdown-wait", daemon=True)
    waiter.start()
    waiter.join(timeout)
    return not waiter.is_alive()
