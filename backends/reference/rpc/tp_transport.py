"""``reference-tp``: the reference RPC agent's frames over direct TCP sockets.

One connection per pair of workers, opened at start with the handshake every
reference transport shares (backends/reference/handshake.py): rank r dials
every lower rank and presents the world's token (drawn by rank 0, published
in the agent's store) in a HELLO; the listener adopts a connection only with
the right token from a rank of this world that is not connected. Anyone
else is refused with the reason (sent back in a REFUSED frame, logged, and kept in
``refused``) while every other connection goes on. A peer whose connection
broke may dial again and be adopted again.

Frames are encoded, read and validated by tp_codec.py (every field before
anything is allocated or delivered); a malformed frame drops that
connection with a logged reason and the agent is told the peer is lost (its outstanding calls fail); every other peer keeps
being served.

Sending never blocks the caller: ``send`` queues the frame's bytes on the
connection's outbox and a writer thread per connection writes them in order,
as TensorPipe's pipes write asynchronously. A peer whose link went silent (a
partition) stops taking bytes once the socket's buffer is full; a caller that
wrote itself would then sit in ``sendall`` past its call's timeout (measured:
rpc_sync never returned within 7 s of a 2 s timeout), where now the agent's
watchdog fails the call in time and the bytes go on once the link heals. A
write that fails loses the peer (``on_peer_lost``: its calls fail naming it).
Shutdown gives the writers ``FLUSH_S`` to drain before closing.

Latency: one ``sendall`` per small frame (TCP_NODELAY), a buffered reader
(a small frame is one ``recv``), and the reader thread delivers in place. The
agent may run a request inline on the reader thread (``runs_inline``); if a
delivery is still busy after ``HANDOVER_S`` (a blocking function), a monitor
hands the connection to a fresh reader thread so the peer's other frames keep
flowing (leader/follower).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time

from .. import handshake
from .tp_codec import HELLO, REFUSED, ProtocolError, encode, hello_bytes, read_frame, read_hello
from .transport import Frame, Transport, TransportError

log = logging.getLogger(__name__)

STORE_PREFIX = "tp"  # the agent's store keys: tp/token, tp/addr/<rank>
SMALL_FRAME = 64 * 1024
READ_BUFFER = 256 * 1024
CONNECT_TIMEOUT_S = 60.0
HANDOVER_S = 0.005
FLUSH_S = 1.0  # how long shutdown lets the writers drain their outboxes
_CLOSE = None  # an outbox's last item: the writer exits


class _Conn:
    __slots__ = ("peer", "sock", "stream", "send_lock", "state_lock", "reader", "busy", "closed", "outbox", "writer")

    def __init__(self, peer: int, sock: socket.socket):
        self.peer = peer
        self.sock = sock
        self.stream = sock.makefile("rb", buffering=READ_BUFFER)
        self.send_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.reader: object | None = None  # token of the thread that reads now
        self.busy: tuple[object, float] | None = None  # (token, since) while the reader delivers
        self.closed = False
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()  # bytes objects, in order; _CLOSE ends the writer
        self.writer: threading.Thread | None = None


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
        self._listener: handshake.Listener | None = None
        self.address: tuple | None = None

    # ------------------------------------------------------------ start
    def start(self, rank, world_size, store, deliver, on_peer_lost) -> None:
        self.rank, self.world_size = rank, world_size
        self._deliver, self._on_peer_lost = deliver, on_peer_lost
        self._token = handshake.world_token(store, STORE_PREFIX, rank)
        self._listener = handshake.Listener(store, STORE_PREFIX, host=self.listen_host, rank=rank,
                                            world_size=world_size, token=self._token, read_hello=read_hello,
                                            adopt=self._adopt, on_refused=self._refuse, refused=self.refused,
                                            thread_name="rpc-tp")
        self.address = self._listener.address
        threading.Thread(target=self._monitor, name=f"rpc-tp-monitor-r{rank}", daemon=True).start()
        hello = hello_bytes(HELLO, {"token": self._token.decode(), "rank": rank})
        # one deadline for the whole start: dialling the lower ranks and being dialled by the higher ones
        deadline = time.monotonic() + self.connect_timeout
        for peer in range(rank):
            try:
                sock = handshake.dial(store, STORE_PREFIX, peer, hello, max(0.001, deadline - time.monotonic()))
            except OSError as exc:
                self.shutdown()
                raise TransportError(f"reference-tp rank {rank}: cannot connect to rank {peer} within "
                                     f"{self.connect_timeout:g} s: {exc}") from None
            self._adopt(peer, sock)
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

    def _refuse(self, sock: socket.socket, address, exc: Exception) -> None:
        """A refused dialer is told why (REFUSED), and the reason is logged."""
        log.warning("reference-tp rank %s refused a connection from %s: %s", self.rank, address, exc)
        try:
            sock.settimeout(0.5)
            sock.sendall(hello_bytes(REFUSED, {"reason": str(exc)}))
        except OSError:
            pass

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
            # the writer runs before the connection is published: shutdown joins the writer of every published
            # connection, and joining a thread not yet started raises
            conn.writer = threading.Thread(target=self._write_loop, args=(conn,), daemon=True,
                                           name=f"rpc-tp-write-r{self.rank}-to{peer}")
            conn.writer.start()
            self._conns[peer] = conn
            self._changed.notify_all()
        threading.Thread(target=self._read_loop, args=(conn, token), daemon=True,
                         name=f"rpc-tp-read-r{self.rank}-from{peer}").start()

    # ---------------------------------------------------------- writing
    def _write_loop(self, conn: _Conn) -> None:
        outbox, sock = conn.outbox, conn.sock
        while True:
            data = outbox.get()
            if data is _CLOSE:
                return
            try:
                sock.sendall(data)
            except OSError as exc:
                self._lose(conn, f"send to rank {conn.peer} failed: {exc}")
                return

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
        conn.outbox.put(_CLOSE)
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
        try:
            parts = encode(frame)
        except (TypeError, ValueError) as exc:  # a tensor that cannot travel: nothing was sent
            raise TransportError(f"reference-tp rank {self.rank}: cannot send to rank {dst}: {exc}") from None
        # a frame's parts go on the outbox together (under the lock), so frames never interleave; small ones as
        # one write
        if len(parts) == 2 or sum(len(p) for p in parts) <= SMALL_FRAME:
            parts = [b"".join(parts)]
        else:  # a tensor's bytes are copied: the caller may change the tensor once send() returned
            parts = [part if isinstance(part, bytes) else bytes(part) for part in parts]
        with conn.send_lock:
            for part in parts:
                conn.outbox.put(part)

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

    def shutdown(self, within_s: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        with self._changed:
            conns = list(self._conns.values())
            self._changed.notify_all()
        flush_end = time.monotonic() + (FLUSH_S if within_s is None else min(FLUSH_S, within_s))
        for conn in conns:  # what was sent before shutdown leaves first, within FLUSH_S in all
            conn.outbox.put(_CLOSE)
        for conn in conns:
            if conn.writer is not None and conn.writer is not threading.current_thread():
                conn.writer.join(max(0.0, flush_end - time.monotonic()))
        for conn in conns:
            self._lose(conn, "transport shut down")
