"""``reference-tp``: the reference RPC agent's frames over direct TCP sockets.

One connection per pair of workers, opened at start: rank r dials every
lower rank and presents the world's token (drawn by rank 0, published in the
agent's store) in a HELLO; the listener adopts a connection only with the
right token from a rank of this world that is not connected. Anyone else is
refused with the reason (sent back in a REFUSED frame, logged, and kept in
``refused``) while every other connection goes on. A peer whose connection
broke may dial again and be adopted again.

A frame on the wire (little endian)::

    prefix   magic "DCRP" | version u8 | kind u8 | n_tensors u16 | msg_id u64 | header_len u32
    tensors  n_tensors x (dtype u8 | ndim u8 | 2 pad | nbytes u64 | ndim x size i64 | ndim x stride i64)
    header   header_len bytes: the agent's pickle, never looked into here
    data     each tensor's nbytes, raw, in order

Every field is validated before anything is allocated or delivered; a
malformed frame drops that connection with a logged reason and the agent is
told the peer is lost (its outstanding calls fail); every other peer keeps
being served. Tensor bytes land in a ``torch.empty`` buffer and become the
tensor by ``as_strided`` with the validated sizes and strides: no copy, no
pickle.

Latency: one ``sendall`` per small frame (TCP_NODELAY), a buffered reader
(a small frame is one ``recv``), and the reader thread delivers in place. The
agent may run a request inline on the reader thread (``runs_inline``); if a
delivery is still busy after ``HANDOVER_S`` (a blocking function), a monitor
hands the connection to a fresh reader thread so the peer's other frames keep
flowing (leader/follower).
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import struct
import threading
import time

import torch

from .transport import Frame, Kind, Transport, TransportError

log = logging.getLogger(__name__)

MAGIC = b"DCRP"
VERSION = 1
PREFIX = struct.Struct("<4sBBHQI")
TENSOR = struct.Struct("<BBxxQ")
HELLO, REFUSED = 0, 255  # transport-private kinds: never delivered to the agent
KINDS = frozenset(int(k) for k in Kind)

MAX_TENSORS = 1 << 12
MAX_DIMS = 16
MAX_HEADER = 1 << 28  # 256 MiB of pickle: anything larger is a garbled length
MAX_TENSOR_BYTES = 1 << 36
MAX_HELLO = 4096
READ_CHUNK = 1 << 20  # a large claimed length is read in chunks: no allocation before bytes arrive
SMALL_FRAME = 64 * 1024
READ_BUFFER = 256 * 1024
HANDSHAKE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 60.0
HANDOVER_S = 0.005

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128)
DTYPE_CODE = {dtype: code for code, dtype in enumerate(DTYPES)}
ITEMSIZE = [torch.empty((), dtype=dtype).element_size() for dtype in DTYPES]


class ProtocolError(Exception):
    """Bytes that are not a frame of this protocol; the connection that sent them is dropped."""


# --------------------------------------------------------------- encoding
def encode(frame: Frame) -> list:
    """The frame as a list of buffers: small ones first, tensor data last."""
    tensors = frame.tensors
    header = frame.header
    parts = [PREFIX.pack(MAGIC, VERSION, frame.kind, len(tensors), frame.msg_id, len(header))]
    if not tensors:
        parts.append(header)
        return parts
    datas = []
    for tensor in tensors:
        code = DTYPE_CODE.get(tensor.dtype)
        if code is None:
            raise TransportError(f"reference-tp cannot send a {tensor.dtype} tensor (supported: "
                                 f"{', '.join(str(d).replace('torch.', '') for d in DTYPES)})")
        if tensor.dim() > MAX_DIMS:
            raise TransportError(f"reference-tp sends tensors of at most {MAX_DIMS} dims, not {tensor.dim()}")
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        nbytes = tensor.numel() * ITEMSIZE[code]
        shape = tuple(tensor.shape)
        strides = tensor.stride()
        parts.append(TENSOR.pack(code, len(shape), nbytes))
        if shape:
            parts.append(struct.pack(f"<{2 * len(shape)}q", *shape, *strides))
        if nbytes:
            flat = tensor.reshape(-1)
            if flat.stride(0) != 1:  # a one-element view keeps an odd stride: copy (see wire.py)
                flat = flat.clone()
            datas.append(memoryview(flat.view(torch.uint8).numpy()))
    parts.append(header)
    parts.extend(datas)
    return parts


def _validate_tensor(code: int, ndim: int, nbytes: int, dims: tuple) -> None:
    if code >= len(DTYPES):
        raise ProtocolError(f"unknown dtype code {code}")
    if ndim > MAX_DIMS:
        raise ProtocolError(f"tensor of {ndim} dims (at most {MAX_DIMS})")
    if nbytes > MAX_TENSOR_BYTES:
        raise ProtocolError(f"tensor of {nbytes} bytes exceeds {MAX_TENSOR_BYTES}")
    itemsize = ITEMSIZE[code]
    if nbytes % itemsize:
        raise ProtocolError(f"{nbytes} bytes is not a whole number of {DTYPES[code]} elements")
    sizes, strides = dims[:ndim], dims[ndim:]
    if any(s < 0 for s in sizes) or any(s < 0 for s in strides):
        raise ProtocolError(f"negative size or stride: sizes {list(sizes)}, strides {list(strides)}")
    if any(s == 0 for s in sizes):
        extent = 0
    else:
        extent = 1
        for size, stride in zip(sizes, strides):
            extent += (size - 1) * stride
            if extent * itemsize > MAX_TENSOR_BYTES:
                raise ProtocolError(f"sizes {list(sizes)} with strides {list(strides)} reach past any tensor")
    if extent * itemsize != nbytes:
        raise ProtocolError(f"{nbytes} data bytes for a {DTYPES[code]} tensor of sizes {list(sizes)}, "
                            f"strides {list(strides)} ({extent * itemsize} expected)")


class _Conn:
    __slots__ = ("peer", "sock", "stream", "send_lock", "state_lock", "reader", "busy", "closed")

    def __init__(self, peer: int, sock: socket.socket):
        self.peer = peer
        self.sock = sock
        self.stream = sock.makefile("rb", buffering=READ_BUFFER)
        self.send_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.reader = None  # token of the thread that reads now
        self.busy = None  # (token, since) while the reader delivers
        self.closed = False


def _read(stream, n: int) -> bytes:
    """Exactly n bytes; EOFError at a clean end before any, ProtocolError when cut short."""
    if n <= READ_CHUNK:
        data = stream.read(n)
        if len(data) == n:
            return data
        if not data:
            raise EOFError
        raise ProtocolError(f"truncated frame: {len(data)} of {n} bytes before the connection closed")
    chunks, got = [], 0
    while got < n:  # a claimed length is only believed as far as bytes arrive
        chunk = stream.read(min(READ_CHUNK, n - got))
        if not chunk:
            raise ProtocolError(f"truncated frame: {got} of {n} bytes before the connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_into(stream, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        chunk = stream.readinto(view[got:got + READ_CHUNK * 64])
        if not chunk:
            raise ProtocolError(f"truncated tensor data: {got} of {n} bytes before the connection closed")
        got += chunk


def read_frame(stream) -> Frame:
    """One frame from a buffered stream, every field checked; EOFError at a clean end."""
    prefix = stream.read(PREFIX.size)
    if len(prefix) != PREFIX.size:
        if not prefix:
            raise EOFError
        raise ProtocolError(f"truncated frame prefix: {len(prefix)} of {PREFIX.size} bytes")
    magic, version, kind, n_tensors, msg_id, header_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}")
    if kind not in KINDS:
        if kind == REFUSED and not n_tensors and header_len <= MAX_HELLO:  # our hello was refused: say why
            raise ProtocolError(f"refused our connection: {_read(stream, header_len).decode(errors='replace')}")
        raise ProtocolError(f"unknown message kind {kind}")
    if n_tensors > MAX_TENSORS:
        raise ProtocolError(f"{n_tensors} tensors in one frame (at most {MAX_TENSORS})")
    if header_len > MAX_HEADER:
        raise ProtocolError(f"header of {header_len} bytes exceeds {MAX_HEADER}")
    specs = []
    for _ in range(n_tensors):
        code, ndim, nbytes = TENSOR.unpack(_read(stream, TENSOR.size))
        if ndim > MAX_DIMS:
            raise ProtocolError(f"tensor of {ndim} dims (at most {MAX_DIMS})")
        dims = struct.unpack(f"<{2 * ndim}q", _read(stream, 16 * ndim)) if ndim else ()
        _validate_tensor(code, ndim, nbytes, dims)
        specs.append((code, ndim, nbytes, dims))
    header = _read(stream, header_len)
    tensors = []
    for code, ndim, nbytes, dims in specs:
        dtype = DTYPES[code]
        if nbytes == 0:
            tensors.append(torch.empty_strided(dims[:ndim], dims[ndim:], dtype=dtype))
            continue
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        _read_into(stream, memoryview(buffer.numpy()))
        tensors.append(buffer.view(dtype).as_strided(dims[:ndim], dims[ndim:]))
    return Frame(kind, msg_id, header, tensors)


def _hello_bytes(kind: int, payload: dict) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, VERSION, kind, 0, 0, len(body)) + body


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """n bytes straight from the socket: a handshake must not read ahead into the frames after it."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ProtocolError(f"connection closed during the handshake ({len(data)} of {n} bytes)")
        data += chunk
    return bytes(data)


def _read_control(sock: socket.socket) -> tuple[int, dict]:
    """A HELLO or REFUSED frame: JSON, small, nothing else accepted (the magic is checked first)."""
    magic = _recv_exactly(sock, len(MAGIC))
    if magic != MAGIC:
        raise ProtocolError(f"not a reference-tp peer (magic {magic!r})")
    _, version, kind, n_tensors, _, length = PREFIX.unpack(magic + _recv_exactly(sock, PREFIX.size - len(MAGIC)))
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}")
    if kind not in (HELLO, REFUSED) or n_tensors or length > MAX_HELLO:
        raise ProtocolError(f"expected a hello, got kind {kind} with {n_tensors} tensors and {length} header bytes")
    try:
        body = json.loads(_recv_exactly(sock, length).decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"hello is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("hello is not a JSON object")
    return kind, body


class TpTransport(Transport):
    name = "reference-tp"
    runs_inline = True  # deliver() may run long work: a monitor hands the connection on

    def __init__(self, listen_host: str = "127.0.0.1", connect_timeout: float = CONNECT_TIMEOUT_S):
        self.listen_host = listen_host
        self.connect_timeout = connect_timeout
        self.refused: list[str] = []  # why each refused connection was refused
        self.dropped: list[str] = []  # why each dropped peer connection was dropped
        self._conns: dict[int, _Conn] = {}
        self._adopt_lock = threading.Lock()
        self._changed = threading.Condition(self._adopt_lock)
        self._closed = False
        self._listener = None
        self.address = None

    # ------------------------------------------------------------ start
    def start(self, rank, world_size, store, deliver, on_peer_lost) -> None:
        self.rank, self.world_size = rank, world_size
        self._deliver, self._on_peer_lost = deliver, on_peer_lost
        self._listener = socket.create_server((self.listen_host, 0), backlog=max(16, world_size))
        host, port = self._listener.getsockname()[:2]
        self.address = (host, port)
        if rank == 0:
            store.set("tp/token", secrets.token_hex(16))
        self._token = store.get("tp/token")
        store.set(f"tp/addr/{rank}", f"{host}:{port}")
        threading.Thread(target=self._accept_loop, name=f"rpc-tp-accept-r{rank}", daemon=True).start()
        threading.Thread(target=self._monitor, name=f"rpc-tp-monitor-r{rank}", daemon=True).start()
        for peer in range(rank):
            peer_host, peer_port = store.get(f"tp/addr/{peer}").decode().rsplit(":", 1)
            sock = socket.create_connection((peer_host, int(peer_port)), timeout=self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(_hello_bytes(HELLO, {"token": self._token.decode(), "rank": rank}))
            sock.settimeout(None)
            self._adopt(peer, sock)
        deadline = time.monotonic() + self.connect_timeout
        with self._changed:
            while len(self._conns) < world_size - 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(rank + 1, world_size)) - set(self._conns))
                    self._changed.release()
                    try:
                        self.shutdown()
                    finally:
                        self._changed.acquire()
                    raise TransportError(f"reference-tp rank {rank}: ranks {missing} did not connect within "
                                         f"{self.connect_timeout:g} s (refused: {self.refused[-3:]})")
                self._changed.wait(min(remaining, 0.5))

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, address = self._listener.accept()
            except OSError:
                return  # listener closed
            threading.Thread(target=self._handshake, args=(sock, address), daemon=True,
                             name=f"rpc-tp-handshake-r{self.rank}").start()

    def _handshake(self, sock: socket.socket, address) -> None:
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            kind, hello = _read_control(sock)
            token, peer = hello.get("token"), hello.get("rank")
            if kind != HELLO:
                raise ProtocolError("first frame is not a hello")
            if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token):
                raise ProtocolError("wrong world token")
            if not isinstance(peer, int) or isinstance(peer, bool) or not self.rank < peer < self.world_size:
                raise ProtocolError(f"rank {peer!r} is not a rank that dials rank {self.rank} "
                                    f"(world size {self.world_size})")
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._adopt(peer, sock)
        except (ProtocolError, OSError, EOFError) as exc:
            reason = f"{address}: {exc}"
            self.refused.append(reason)
            log.warning("reference-tp rank %s refused a connection from %s", self.rank, reason)
            try:
                sock.settimeout(0.5)
                sock.sendall(_hello_bytes(REFUSED, {"reason": str(exc)}))
            except OSError:
                pass
            sock.close()

    def _adopt(self, peer: int, sock: socket.socket) -> None:
        with self._changed:  # two hellos claiming one rank at once: the second is refused
            if self._closed:
                raise ProtocolError("transport is shut down")
            old = self._conns.get(peer)
            if old is not None and not old.closed:
                raise ProtocolError(f"rank {peer} is already connected")
            conn = _Conn(peer, sock)
            token = object()
            conn.reader = token
            self._conns[peer] = conn
            self._changed.notify_all()
        threading.Thread(target=self._read_loop, args=(conn, token), daemon=True,
                         name=f"rpc-tp-read-r{self.rank}-from{peer}").start()

    # ---------------------------------------------------------- reading
    def _read_loop(self, conn: _Conn, token) -> None:
        stream, peer, deliver, state_lock = conn.stream, conn.peer, self._deliver, conn.state_lock
        try:
            while True:
                frame = read_frame(stream)
                if self._closed:
                    return
                conn.busy = (token, time.monotonic())
                deliver(peer, frame)
                with state_lock:
                    if conn.reader is not token:
                        return  # handed over while delivering: the new reader goes on
                    conn.busy = None
        except EOFError:
            reason = f"rank {peer} closed the connection"
        except ProtocolError as exc:
            reason = f"rank {peer} sent a malformed frame ({exc}); connection dropped"
        except OSError as exc:
            reason = f"connection to rank {peer} failed: {exc}"
        except Exception as exc:  # MemoryError for a garbled length, a bug in deliver: never die silently
            reason = f"rank {peer} connection failed while reading ({type(exc).__name__}: {exc}); connection dropped"
        self._lose(conn, reason)

    def _lose(self, conn: _Conn, reason: str) -> None:
        with self._changed:
            if conn.closed:
                return
            conn.closed = True
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            conn.sock.close()  # the reader's stream is left to it: closing it here could block on its lock
        except OSError:
            pass
        if self._closed:
            return
        if "closed the connection" in reason:
            log.info("reference-tp rank %s: %s", self.rank, reason)
        else:
            self.dropped.append(reason)
            log.warning("reference-tp rank %s: %s", self.rank, reason)
        self._on_peer_lost(conn.peer, reason)

    def _monitor(self) -> None:
        """Hand a connection to a new reader when its reader has been busy for HANDOVER_S."""
        while not self._closed:
            time.sleep(HANDOVER_S)
            now = time.monotonic()
            for conn in list(self._conns.values()):
                busy = conn.busy
                if busy is None or now - busy[1] < HANDOVER_S or conn.closed:
                    continue
                with conn.state_lock:
                    if conn.busy is not busy or conn.reader is not busy[0]:
                        continue
                    token = object()
                    conn.reader = token
                    conn.busy = None
                threading.Thread(target=self._read_loop, args=(conn, token), daemon=True,
                                 name=f"rpc-tp-read-r{self.rank}-from{conn.peer}").start()

    # ---------------------------------------------------------- sending
    def send(self, dst: int, frame: Frame) -> None:
        conn = self._conns.get(dst)
        if conn is None and not self._closed and 0 <= dst < getattr(self, "world_size", 0):
            conn = self._await_peer(dst)
        if conn is None or conn.closed:
            if not 0 <= dst < getattr(self, "world_size", 0) or dst == getattr(self, "rank", -1):
                raise TransportError(f"reference-tp: no peer rank {dst}")
            raise TransportError(f"reference-tp rank {self.rank}: rank {dst} is not connected"
                                 + (" (transport shut down)" if self._closed else ""))
        parts = encode(frame)
        try:
            if len(parts) == 2:
                data = parts[0] + parts[1]
                with conn.send_lock:
                    conn.sock.sendall(data)
                return
            small = sum(len(p) for p in parts)
            if small <= SMALL_FRAME:
                data = b"".join(parts)
                with conn.send_lock:
                    conn.sock.sendall(data)
                return
            with conn.send_lock:
                for part in parts:
                    conn.sock.sendall(part)
        except OSError as exc:
            self._lose(conn, f"send to rank {dst} failed: {exc}")
            raise TransportError(f"reference-tp rank {self.rank}: send to rank {dst} failed: {exc}") from None

    def _await_peer(self, dst: int):
        """A peer not dialled yet: we are still starting (a started peer already calls us). Wait for it."""
        deadline = time.monotonic() + self.connect_timeout
        with self._changed:
            while dst not in self._conns and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(min(remaining, 0.5))
            return self._conns.get(dst)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            try:  # wakes the accept loop; close() alone leaves it blocked and the port listening
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        with self._changed:
            conns = list(self._conns.values())
            self._changed.notify_all()
        for conn in conns:
            self._lose(conn, "transport shut down")
