"""RPC frames over the c10d process group under test (agent ``reference-pg``).

The design is PyTorch's ProcessGroupAgent (removed in 1.9): every message is
tagged send/recv on a process group, and one listener thread per rank
receives from any source. Here the group is created collectively in
``start()`` with ``dist.new_group`` on the default group's backend, so RPC
traffic never shares tags with the default group and the backend under test
(gloo, the project's ``reference``, a vendor's) carries every byte.

One frame is, in this order, from one sender to one receiver:

1. ``META_TAG``: a uint8 tensor of ``META_BYTES`` (4 KiB): eight int64 fields
   ``[MAGIC, kind, msg_id, header_len, n_tensors, desc_len, inline, last]``
   then room for a whole small frame. It has the same size for every frame,
   so the listener can keep ``RECV_DEPTH`` receives from any source posted
   for it (and it is never empty: gloo cannot receive an empty tensor from
   any source). When
   the header, the tensor descriptors (per tensor int64 ``dtype code, ndim,
   *shape``) and the tensor bytes fit, they follow the fields and the frame
   is this one message (``inline = 1``, the last field the count of tensor
   bytes): a typical RPC costs one c10d message, not three. Once
   ``send_window`` metas to a peer are posted and not yet completed, further
   small frames to it wait in an outbox and leave together when one of those
   completes, as one batch meta (``inline = 2``, the last field the record
   count) whose records are inline frames exactly as they would travel
   alone. A burst of rpc_async then costs a few c10d messages, not one per
   call; a lone call (the sync ping-pong) never waits in the outbox;
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
SPLIT, INLINE, BATCH = 0, 1, 2  # a meta's inline flag: body messages follow / one frame inline / records
META_TAG = 7001
BODY_TAG = 7002
STOP_KIND = -1  # transport control frame: "no more frames from me to you"
SHUTDOWN_JOIN_S = 10.0  # bound of a shutdown whose peers do not answer
LAST_STOP_GRACE_S = 0.5  # the listener's last steps after the last STOP arrived
START_TIMEOUT_S = 60.0
RECV_DEPTH = 8  # receives from any source kept posted by the listener
# Metas to one peer posted and not yet taken before further small frames wait in an
# outbox and leave together, in one batch meta, when one of those completes.
SEND_WINDOW = 2
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


def _parts(frame: Frame, kind: int) -> tuple[bytes, int, int, list[torch.Tensor]]:
    """(header + descriptors, header length, tensor count, data tensors); raises on anything that cannot travel."""
    header = frame.header
    if not isinstance(header, (bytes, bytearray, memoryview)):
        raise TypeError(f"frame header must be bytes, got {type(header).__name__}")
    header = bytes(header)
    for name, value in (("kind", kind), ("msg_id", frame.msg_id)):
        if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"frame {name} must be an int64, got {value!r}")
    if not frame.tensors:  # the common RPC: a pickle and nothing else
        return header, len(header), 0, []
    desc: list[int] = []
    datas: list[torch.Tensor] = []
    for index, tensor in enumerate(frame.tensors):
        data = _tensor_bytes(tensor, index)
        desc += [DTYPE_CODES[tensor.dtype], tensor.dim(), *tensor.shape]
        if data.numel():
            datas.append(data)
    return header + struct.pack(f"<{len(desc)}q", *desc), len(header), len(frame.tensors), datas


def encode_frame(frame: Frame, kind: int | None = None):
    """``(record, None)`` for a frame that fits ``INLINE_CAPACITY``, else ``(None, (meta, body, datas))``.

    A record is the whole frame as bytes, fields first (``inline = 1``, the last field
    the count of tensor bytes after the header and descriptors): alone in a meta
    message it is one c10d message instead of up to 2 + n_tensors, which is what an
    RPC's latency over a c10d backend is made of; several records also share one
    meta (``batch_meta``).
    """
    kind = frame.kind if kind is None else kind
    payload, header_len, n_tensors, datas = _parts(frame, kind)
    data_len = sum(data.numel() for data in datas)
    desc_len = len(payload) - header_len
    if len(payload) + data_len <= INLINE_CAPACITY:
        fields = _FIELDS.pack(MAGIC, kind, frame.msg_id, header_len, n_tensors, desc_len, INLINE, data_len)
        if not datas:
            return fields + payload, None
        return b"".join([fields, payload, *(bytes(data.numpy()) for data in datas)]), None
    meta = _meta(_FIELDS.pack(MAGIC, kind, frame.msg_id, header_len, n_tensors, desc_len, SPLIT, 0))
    body = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else None
    return None, (meta, body, datas)


def _meta(content: bytes) -> torch.Tensor:
    """A meta message holding ``content``; the tail is zeros, never stale process memory."""
    buffer = bytearray(META_BYTES)
    buffer[:len(content)] = content
    return torch.frombuffer(buffer, dtype=torch.uint8)


def batch_meta(records) -> torch.Tensor:
    """One meta message carrying several inline records (``inline = 2``), sent in their order.

    The fields say ``header_len`` = the records' total length and, last, how many
    there are; the records follow, each exactly as it would travel alone.
    """
    body = b"".join(records)
    if len(body) > INLINE_CAPACITY:
        raise ValueError(f"a batch of {len(body)} bytes does not fit the {INLINE_CAPACITY} inline bytes")
    return _meta(_FIELDS.pack(MAGIC, 0, 0, len(body), 0, 0, BATCH, len(records)) + body)


def encode(frame: Frame, kind: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """(meta, body or None, data tensors) of one frame sent alone; raises on anything that cannot travel."""
    record, split = encode_frame(frame, kind)
    if record is not None:
        return _meta(record), None, []  # a lone inline frame's meta is its record
    return split


def decode_meta(fields: bytes, src: int) -> tuple[int, int, int, int, int, int, int]:
    """(kind, msg_id, header_len, n_tensors, desc_len, inline flag, last field) from a meta's first
    FIELDS_BYTES (or a batch record's); the last field is an inline record's data length, a batch's
    record count."""
    if len(fields) < FIELDS_BYTES:
        raise FrameError(f"frame from rank {src}: {len(fields)} bytes where {FIELDS_BYTES} bytes of fields belong")
    magic, kind, msg_id, header_len, n_tensors, desc_len, inline, last = _FIELDS.unpack_from(fields)
    if magic != MAGIC:
        raise FrameError(f"frame from rank {src} starts with {magic:#x}, not the magic {MAGIC:#x}")
    if not (0 <= header_len <= MAX_HEADER and 0 <= n_tensors <= MAX_TENSORS and 0 <= desc_len <= MAX_HEADER
            and inline in (SPLIT, INLINE, BATCH)):
        raise FrameError(f"frame from rank {src} has impossible fields: header {header_len} bytes, "
                         f"{n_tensors} tensors, descriptors {desc_len} bytes, inline flag {inline}")
    if inline != SPLIT and (header_len + desc_len > INLINE_CAPACITY or not 0 <= last <= INLINE_CAPACITY):
        raise FrameError(f"frame from rank {src}: an inline frame of {header_len + desc_len} bytes "
                         f"(last field {last}) does not fit the {INLINE_CAPACITY} inline bytes")
    return kind, msg_id, header_len, n_tensors, desc_len, inline, last


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
    """The frame whose meta message is ``raw`` (one frame, not a batch); ``receive(nbytes)``
    returns the next BODY_TAG message from ``src`` as a uint8 tensor. None for a STOP frame."""
    frames = read_frames(raw, src, receive)
    if len(frames) != 1:
        raise FrameError(f"frame from rank {src}: a batch of {len(frames)} frames where one was expected")
    return frames[0]


def read_frames(raw: bytes, src: int, receive) -> list:
    """Every frame a meta message ``raw`` starts: one (None for a STOP), or a batch's, in order."""
    kind, msg_id, header_len, n_tensors, desc_len, inline, last = decode_meta(raw, src)
    if inline == BATCH:
        return _read_batch(raw[FIELDS_BYTES:FIELDS_BYTES + header_len], last, src)
    if inline == INLINE:
        return [_inline_frame(raw, src, (kind, msg_id, header_len, n_tensors, desc_len, inline, last))]
    if header_len + desc_len:
        payload = receive(header_len + desc_len).numpy().tobytes()
    else:
        payload = b""
    header, desc = payload[:header_len], payload[header_len:]
    tensors = []
    for dtype, shape in decode_descriptors(desc, n_tensors, src):
        tensor = torch.empty(shape, dtype=dtype)
        if tensor.numel():
            tensor = receive(tensor.numel() * tensor.element_size()).view(dtype).reshape(shape)
        tensors.append(tensor)
    if kind == STOP_KIND:
        return [None]
    return [Frame(kind=kind, msg_id=msg_id, header=header, tensors=tensors)]


def _inline_frame(record: bytes, src: int, fields) -> Frame | None:
    """The frame of one inline record (its fields already decoded); None for a STOP."""
    kind, msg_id, header_len, n_tensors, desc_len, _, data_len = fields
    start = FIELDS_BYTES + header_len + desc_len
    header = record[FIELDS_BYTES:FIELDS_BYTES + header_len]
    desc = record[FIELDS_BYTES + header_len:start]
    descs = decode_descriptors(desc, n_tensors, src) if desc or n_tensors else ()
    tensors = decode_inline_tensors(record[start:], descs, src) if descs else []
    got = sum(t.numel() * t.element_size() for t in tensors)
    if got != data_len:
        raise FrameError(f"frame from rank {src}: inline tensors of {got} bytes where the fields say {data_len}")
    if kind == STOP_KIND:
        return None
    return Frame(kind=kind, msg_id=msg_id, header=header, tensors=tensors)


def _read_batch(body: bytes, count: int, src: int) -> list[Frame]:
    """The frames of a batch meta's records, each checked as if it had come alone."""
    if count < 1:
        raise FrameError(f"frame from rank {src}: a batch of {count} records")
    frames, at = [], 0
    for index in range(count):
        fields = decode_meta(body[at:at + FIELDS_BYTES], src)
        kind, _, header_len, _, desc_len, inline, data_len = fields
        if inline != INLINE or kind == STOP_KIND:
            raise FrameError(f"frame from rank {src}: batch record {index} of {count} is not an inline frame "
                             f"(kind {kind}, inline flag {inline})")
        end = at + FIELDS_BYTES + header_len + desc_len + data_len
        if end > len(body):
            raise FrameError(f"frame from rank {src}: batch record {index} of {count} ends at byte {end}, "
                             f"after the batch's {len(body)} bytes")
        frames.append(_inline_frame(body[at:end], src, fields))
        at = end
    if at != len(body):
        raise FrameError(f"frame from rank {src}: {len(body) - at} stray bytes after a batch of {count} records")
    return frames


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
    send_window = SEND_WINDOW  # a very large value sends every frame in a meta of its own

    def __init__(self) -> None:
        self._group = None
        self._rank = -1
        self._world_size = 0
        self._deliver = None
        self._on_peer_lost = None
        self._listener: threading.Thread | None = None
        self._state = threading.Lock()  # guards the sets and flags below
        self._dst_locks: dict[int, threading.RLock] = {}  # reentrant: _post may _lose the peer
        self._outbox: dict[int, list[bytes]] = {}  # peer -> inline records waiting for a batch meta
        self._unfinished: dict[int, int] = {}  # peer -> metas posted and not yet completed
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
        self.metas_received = 0  # meta messages (a batch meta carries several frames)

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
        self._dst_locks = {peer: threading.RLock() for peer in self._peers()}
        self._outbox = {peer: [] for peer in self._peers()}
        self._unfinished = dict.fromkeys(self._peers(), 0)
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
        record, split = encode_frame(frame)
        if record is not None:
            nbytes = len(record)
        else:
            meta, body, datas = split
            nbytes = META_BYTES + (body.numel() if body is not None else 0) + sum(d.numel() for d in datas)
        # The listener never waits for credit: its frames (answers sent from deliver()) are
        # what frees the peer's credit, and the peer's listener ours.
        self._credits.acquire(nbytes, wait=threading.current_thread() is not self._listener)
        posted = False
        try:
            with self._dst_locks[dst]:
                self._check_open(dst)
                if record is not None and len(record) <= INLINE_CAPACITY and (
                        self._outbox[dst] or self._unfinished[dst] >= self.send_window):
                    # Earlier metas to dst are not taken yet: this frame waits in the outbox and
                    # leaves with the others in one batch meta when one of them completes.
                    self._outbox[dst].append(record)
                    posted = True
                    return
                self._flush(dst)  # anything queued goes first: frames to one peer keep their order
                if record is not None:
                    self._post(dst, _meta(record), None, [], nbytes, 1)
                else:
                    self._post(dst, meta, body, datas, nbytes, 1)
                posted = True
        finally:
            if not posted:
                self._credits.release(nbytes)

    def _check_open(self, dst: int, stop: bool = False) -> None:
        """Raise TransportError naming why nothing more may go to ``dst`` (a STOP still may)."""
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

    def _flush(self, dst: int) -> None:
        """Post the outbox of ``dst`` as batch metas, in order (under the dst lock)."""
        records = self._outbox[dst]
        if not records:
            return
        self._outbox[dst] = []
        start = 0
        while start < len(records):
            end, size = start, 0
            while end < len(records) and (end == start or size + len(records[end]) <= INLINE_CAPACITY):
                size += len(records[end])
                end += 1
            try:
                self._post(dst, batch_meta(records[start:end]), None, [], size, end - start)
            except BaseException:
                rest = records[start:]  # not posted: their credit goes back (_post lost the peer)
                self._credits.release(sum(map(len, rest)), len(rest))
                raise
            start = end

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
        """Wait, in posting order, for the sends to complete; a failure loses the peer. A
        completed meta lets the frames queued for that peer leave (``_flush``)."""
        while True:
            item = completions.get()
            if item is None:
                return
            dst, works, keep, nbytes, frames = item
            try:
                self._await(dst, works, keep)
            except TransportError:
                pass  # _await told the agent through on_peer_lost
            finally:
                del keep, item
                self._credits.release(nbytes, frames)
            with self._dst_locks[dst]:
                self._unfinished[dst] -= 1
                if self._outbox[dst]:
                    try:
                        self._flush(dst)
                    except TransportError:
                        pass  # the peer is lost: on_peer_lost said so

    def _post(self, dst: int, meta, body, datas, nbytes: int, frames: int) -> None:
        """Post every message of one meta's frame(s) (under ``dst``'s lock); the completer awaits them."""
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
        self._unfinished[dst] += 1
        self._completer().put((dst, works, keep, nbytes, frames))

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
        with self._dst_locks[peer]:  # frames queued for it will never leave: their credit goes back
            dropped, self._outbox[peer] = self._outbox[peer], []
            self._credits.release(sum(map(len, dropped)), len(dropped))
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
            self.metas_received += 1
            try:
                frames = self._read_rest(group, src, raw)
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
            for frame in frames:
                if frame is None:  # STOP (always alone in its meta)
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

    def _read_rest(self, group, src: int, raw: bytes) -> list:
        def receive(nbytes: int) -> torch.Tensor:
            buffer = torch.empty(nbytes, dtype=torch.uint8)
            group.recv([buffer], src, BODY_TAG).wait()
            return buffer

        return read_frames(raw, src, receive)

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
        with self._dst_locks[dst]:
            try:
                self._flush(dst)  # frames queued for dst leave before its STOP
                self._check_open(dst, stop=True)
                work = self._group.send([meta], dst, META_TAG)
            except TransportError:
                return  # the peer is unreachable: it needs no STOP from us
            except Exception as exc:
                self._lose(dst, f"posting a STOP to rank {dst} failed: {exc}")
                return
        with self._state:
            self._stop_works.append((dst, [work], [meta]))

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
                    "frames_received": self.frames_received, "metas_received": self.metas_received,
                    "group_destroyed": self._group_destroyed}


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

    def release(self, nbytes: int, frames: int = 1) -> None:
        with self._cond:
            self.frames -= frames
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
