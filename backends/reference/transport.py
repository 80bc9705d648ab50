"""The reference backend's transport: one TCP connection per pair of ranks.

Rendezvous goes through the c10d Store the group is given, with the
handshake every reference transport shares (handshake.py): rank 0 draws a
token, every rank publishes its listening address, rank r dials every lower
rank and presents (token, rank) in a HELLO frame; the listener accepts a
connection only with the right token from an expected rank that is not
connected yet. Anyone else is refused and counted in ``refused`` with the
reason: the store is the membership.

Each connection has a reader thread that parses frames (backends/reference/
wire.py) and files them in the mailbox. A malformed frame from a connected
peer breaks that connection with a ProtocolError: every operation waiting on
that peer fails with the error instead of hanging.
"""

from __future__ import annotations

import collections
import select
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from . import handshake, wire
STORE_PREFIX = "reference"  # the group's store keys: reference/token, reference/addr/<rank>
SMALL_FRAME_BYTES = 64 * 1024
READ_BUFFER_BYTES = 256 * 1024


class PeerError(RuntimeError):
    """The connection to a peer is gone or was refused; the message says why."""


class RecvTimeout(RuntimeError):
    pass


class ClosedMidFrame(wire.ProtocolError):
    """The connection ended inside a frame: the peer closed it, or its send was cut short at its deadline (a
    frame it could not finish writing: SendTimeout on its side), or an outsider sent part of a hello."""


class SendTimeout(RuntimeError):
    """A send did not fit into the connection before its deadline (the peer reads nothing: a silent partition, a
    frozen peer); ``peer`` is the rank it was for. The frame is cut short, so the connection is closed."""

    def __init__(self, message: str, peer: int):
        super().__init__(message)
        self.peer = peer


class _Frame:
    """A frame on its way to one peer: what is left of it to write, by when, and whom to tell."""

    __slots__ = ("parts", "deadline", "done", "started")

    def __init__(self, parts: list[memoryview], deadline: float | None, done: Callable[[Exception | None], None]):
        self.parts, self.deadline, self.done = parts, deadline, done
        self.started = False  # some of its bytes are in the connection: it can no longer be taken back


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer has closed ``sock`` (its FIN or a reset arrived), asked of the kernel without reading:
    data still unread before the end does not hide it (POLLRDHUP)."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLRDHUP)
    except (ValueError, OSError):  # closed under us (fileno -1): gone as well
        return True
    return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL)
               for _, events in poller.poll(0))


def _write_now(sock: socket.socket, frame: _Frame) -> bool:
    """Write what of ``frame`` fits into the connection without waiting; True once all of it is written."""
    while frame.parts:
        part = frame.parts[0]
        try:
            sent = sock.send(part, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        frame.started = True
        if sent < len(part):
            frame.parts[0] = part[sent:]
            return False
        frame.parts.pop(0)
    return True


class _Outgoing:
    """The frames to one peer, in order, and the thread that writes those that did not fit at once.

    A frame that fits into the connection is written on the sender's thread (the common case: one
    system call, no hand-over); the rest of one that does not, and every frame after it, wait here
    for the writer, so a sender never blocks on a peer that reads nothing (gloo's send returns its
    Work at once too; a caller whose frame sat in a full connection was held for the group's timeout,
    days for an RPC agent's group). The head of the queue is the frame being written.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: collections.deque[_Frame] = collections.deque()
        self.writer: threading.Thread | None = None


class PostedRecv:
    """A receive waiting for its message: from one source, or any (src=None)."""

    __slots__ = ("src", "tag", "callback")

    def __init__(self, src, tag, callback):
        self.src, self.tag, self.callback = src, tag, callback


class Mailbox:
    """Frames that arrived, by key, plus receives posted before their frame arrived.

    Keys: ("p2p", src, tag) for point-to-point, ("coll", seq, step, src) for
    collective traffic. Frames with one key are delivered in arrival order.
    """

    def __init__(self):
        self.lock = threading.Condition()
        self.frames: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
        self.posted: list[PostedRecv] = []

    def deliver(self, key: tuple, frame) -> None:
        callback = None
        with self.lock:
            if key[0] == "p2p":
                for posted in self.posted:
                    if posted.tag == key[2] and posted.src in (None, key[1]):
                        self.posted.remove(posted)
                        callback = posted.callback
                        break
            if callback is None:
                self.frames[key].append(frame)
                self.lock.notify_all()
        if callback is not None:
            callback(key[1], frame)

    def post(self, src, tag, callback) -> PostedRecv | None:
        """Match a queued p2p frame now, or leave the receive posted (returned)."""
        with self.lock:
            for key, queue in self.frames.items():
                if key[0] == "p2p" and queue and key[2] == tag and src in (None, key[1]):
                    frame = queue.popleft()
                    matched = key[1]
                    break
            else:
                posted = PostedRecv(src, tag, callback)
                self.posted.append(posted)
                return posted
        callback(matched, frame)
        return None

    def fail_posted(self, src: int, error: Exception) -> None:
        """The connection to ``src`` broke: every receive posted for it gets ``callback(src, error)``."""
        with self.lock:
            failed = [posted for posted in self.posted if posted.src == src]
            for posted in failed:
                self.posted.remove(posted)
        for posted in failed:
            posted.callback(src, error)

    def cancel(self, posted: PostedRecv) -> bool:
        with self.lock:
            if posted in self.posted:
                self.posted.remove(posted)
                return True
            return False

    def take(self, keys: list[tuple], deadline: float, broken) -> dict[tuple, object]:
        """Block until a frame is there for every key; raise on timeout or a broken peer."""
        got: dict[tuple, object] = {}
        with self.lock:
            while True:
                for key in keys:
                    if key not in got and self.frames.get(key):
                        got[key] = self.frames[key].popleft()
                if len(got) == len(keys):
                    return got
                failure = broken([key for key in keys if key not in got])
                if failure:
                    raise failure
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RecvTimeout([key for key in keys if key not in got])
                self.lock.wait(min(remaining, 0.5))

    def wake(self) -> None:
        with self.lock:
            self.lock.notify_all()


class Mesh:
    """The connections of one process group's rank to all its peers."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, host: str | None = None,
                 lazy: bool = False):
        self.rank, self.size = rank, size
        self.mailbox = Mailbox()
        self.refused: list[str] = []  # why each refused connection was refused
        self.broken: dict[int, str] = {}  # peer -> why its connection is gone
        self._conns: dict[int, socket.socket] = {}
        self._outgoing = {peer: _Outgoing() for peer in range(size) if peer != rank}
        self._closed = False
        self._ready = threading.Event()
        self._adopt_lock = threading.Lock()
        self._dial_lock = threading.Lock()  # one dial per peer, whichever thread connects first
        self._timeout = timeout
        host = host or handshake.listen_host("DISTCONFORM_REFERENCE_IFNAME", "DISTCONFORM_REFERENCE_HOST")

        # every store read of the rendezvous waits at most the group's timeout, as connecting does below: a peer that
        # never publishes (one that took another number: tests/seeded/reference_shrink_after_fault_keeps_numbers.py)
        # must fail the group's making within it, not after the store's own timeout
        wait_s = timeout.total_seconds()
        try:
            self._token = handshake.world_token(store, STORE_PREFIX, rank, wait_s).decode()
        except dist.DistStoreError as exc:
            raise PeerError(f"reference rank {rank}: rank 0 published no world token within {wait_s:g} s: "
                            f"{str(exc).splitlines()[0]}") from None
        self._listener = handshake.Listener(store, STORE_PREFIX, host=host, rank=rank, world_size=size,
                                            token=self._token.encode(), read_hello=_read_hello, adopt=self._adopt,
                                            refused=self.refused, thread_name="reference")
        hello = wire.encode_meta({"token": self._token, "rank": rank})
        self._hello = wire.encode_header(wire.HELLO, 0, hello, 0) + hello
        # the addresses of the ranks this one dials, read while the group is made: a lazy group's first operation
        # then needs no store (torch's TCPStore get does not bound a request dropped on the way, backends/spec.py
        # TCPSTORE_GET_UNBOUNDED), only the connections it opens within its timeout
        try:
            self._addresses = {peer: handshake.address_of(store, STORE_PREFIX, peer, wait_s) for peer in range(rank)}
        except dist.DistStoreError as exc:
            self.close()
            raise PeerError(f"reference rank {rank}: a lower rank published no address to dial within {wait_s:g} s: "
                            f"{str(exc).splitlines()[0]}") from None
        if not lazy:
            try:
                self.connect(range(size), time.monotonic() + timeout.total_seconds())
            except PeerError:
                self.close()
                raise

    def connect(self, peers, deadline: float) -> None:
        """Connect to every one of ``peers`` not connected yet, by ``deadline`` (time.monotonic()) or PeerError:
        dial the lower ranks, wait for the higher ones to dial. Made at once by an eager group; by a lazy one
        (DISTCONFORM_REFERENCE_LAZY_INIT=1) pair by pair, as its operations first need them, as gloo's lazy init
        connects. One deadline for all of it: the group's timeout bounds the whole connection, not each dial."""
        if len(self._conns) == self.size - 1:  # every pair connected: each collective's round asks, so ask cheaply
            return
        wanted = sorted(set(peers) - {self.rank})
        if all(peer in self._conns for peer in wanted):
            return
        timeout_s = self._timeout.total_seconds()
        with self._dial_lock:
            for peer in (p for p in wanted if p < self.rank and p not in self._conns):
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise TimeoutError("no time left")
                    sock = handshake.dial_address(self._addresses[peer], self._hello, remaining)
                except Exception as exc:  # the store's error, a refused or silent dial: the peer named
                    raise PeerError(f"reference rank {self.rank}: could not connect to rank {peer} within "
                                    f"{timeout_s:g} s: {type(exc).__name__}: {exc}") from None
                self._adopt(peer, sock)
        while not all(peer in self._conns for peer in wanted):
            if time.monotonic() > deadline:
                missing = [peer for peer in wanted if peer not in self._conns]
                raise PeerError(f"reference rank {self.rank}: not dialled by ranks {missing} within "
                                f"{timeout_s:g} s")
            self._ready.wait(0.05)
            self._ready.clear()

    def connected(self) -> list[int]:
        """The peers this rank has a connection to (broken ones included)."""
        return sorted(self._conns)

    def _adopt(self, peer: int, sock: socket.socket) -> None:
        with self._adopt_lock:  # two hellos claiming one rank at once: the second is refused
            if peer in self._conns:
                raise wire.ProtocolError(f"rank {peer} is already connected")
            self._conns[peer] = sock
        threading.Thread(target=self._read_loop, args=(peer, sock), daemon=True,
                         name=f"reference-read-r{self.rank}-from{peer}").start()
        self._ready.set()

    # ------------------------------------------------------------- reading
    def _read_loop(self, peer: int, sock: socket.socket) -> None:
        # buffered: a small frame (header, meta, data) usually arrives in one recv
        stream = sock.makefile("rb", buffering=READ_BUFFER_BYTES)
        try:
            while True:
                kind, tag, meta_len, data_len = wire.decode_header(_read_exactly(stream, wire.HEADER.size))
                meta = wire.decode_meta(_read_exactly(stream, meta_len))
                data = _read_exactly(stream, data_len) if data_len else bytearray()
                if kind == wire.P2P:
                    self.mailbox.deliver(("p2p", peer, tag), (meta, data))
                elif kind == wire.COLL:
                    seq, step = meta.get("seq"), meta.get("step")
                    if not isinstance(seq, int) or not isinstance(step, int):
                        raise wire.ProtocolError(f"collective frame without seq/step: {meta!r}")
                    self.mailbox.deliver(("coll", seq, step, peer), (meta, data))
                else:
                    raise wire.ProtocolError(f"unexpected {wire.KINDS[kind]} frame after the handshake")
        except EOFError:
            reason = "closed the connection"
        except ClosedMidFrame as exc:  # not a malformed frame: the peer gave up on it (a send past its deadline)
            reason = f"closed the connection in the middle of a frame ({exc})"
        except wire.ProtocolError as exc:
            reason = f"sent a malformed frame ({exc}); connection refused"
        except OSError as exc:
            reason = f"connection failed: {exc}"
        except Exception as exc:  # e.g. MemoryError for a garbled data length: never die silently
            reason = f"sent a frame that could not be read ({type(exc).__name__}: {exc}); connection refused"
        if not self._closed:
            self.broken[peer] = f"rank {peer} {reason}"
            self.mailbox.fail_posted(peer, PeerError(f"reference rank {self.rank}: {self.broken[peer]}"))
        try:
            stream.close()
            sock.close()
        except OSError:
            pass
        self.mailbox.wake()

    def failure_for(self, peers) -> PeerError | None:
        """The error to raise when waiting on any of these peers, if one is broken."""
        for peer in peers:
            if peer in self.broken:
                return PeerError(f"reference rank {self.rank}: {self.broken[peer]}")
        if self._closed:
            return PeerError(f"reference rank {self.rank}: process group was shut down")
        return None

    # ------------------------------------------------------------- sending
    def send(self, peer: int, kind: int, tag: int, meta: dict, data: memoryview | bytes = b"",
             deadline: float | None = None) -> None:
        """Send one frame to ``peer`` and return once it is written into the connection; by ``deadline``
        (time.monotonic()) or SendTimeout, when one is given."""
        written = threading.Event()
        outcome: list[Exception | None] = []

        def done(error: Exception | None) -> None:
            outcome.append(error)
            written.set()

        frame = self.post(peer, kind, tag, meta, data, deadline, done)
        if frame is not None and not written.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            if self._take_back(peer, frame):  # still waiting behind another frame: the connection is intact
                raise SendTimeout(f"reference rank {self.rank}: send to rank {peer} timed out: the frames "
                                  "before it are still unsent at its deadline", peer)
            written.wait()  # the writer is on it, and gives up at the same deadline
        if outcome and outcome[0] is not None:
            raise outcome[0]

    def post(self, peer: int, kind: int, tag: int, meta: dict, data: memoryview | bytes,
             deadline: float | None, done: Callable[[Exception | None], None]) -> _Frame | None:
        """Start sending one frame to ``peer`` without waiting for the connection: ``done(None)`` once it is
        written, ``done(error)`` if it cannot be by ``deadline`` (SendTimeout; the connection is then closed, a
        frame cut short leaving nothing later readable) or the connection fails (PeerError). Called at once when
        the frame fits (None is returned), else from the peer's writer thread (the frame is returned). A peer
        already lost raises PeerError here."""
        encoded = wire.encode_meta(meta)
        if peer == self.rank:  # to self: straight into the mailbox, copied like a real send
            frame = (wire.decode_meta(encoded), bytearray(data))
            if kind == wire.P2P:
                self.mailbox.deliver(("p2p", peer, tag), frame)
            else:
                self.mailbox.deliver(("coll", meta["seq"], meta["step"], peer), frame)
            done(None)
            return None
        failure = self.failure_for([peer])
        if failure:
            raise failure
        sock = self._conns[peer]
        if _hung_up(sock):
            # the peer closed the connection and this rank's reader has not got to its end yet: a collective the
            # peer gave up (timed out) must not be completed here with the frame it sent before closing (under
            # load the reader came second and rank 1's next all_reduce returned while rank 0's had failed)
            self.broken.setdefault(peer, f"rank {peer} closed the connection")
            raise PeerError(f"reference rank {self.rank}: {self.broken[peer]}")
        head = wire.encode_header(kind, tag, encoded, len(data)) + encoded
        if len(data) <= SMALL_FRAME_BYTES:  # one system call for latency-bound messages
            parts = [memoryview(head + bytes(data))]
        else:  # the data travels from where it is: the sender keeps the tensor until the Work completes
            parts = [memoryview(head), memoryview(data).cast("B")]
        pending = _Frame(parts, deadline, done)
        outgoing = self._outgoing[peer]
        with outgoing.cond:
            try:
                written = not outgoing.queue and _write_now(sock, pending)
            except OSError as exc:
                self.broken.setdefault(peer, f"send to rank {peer} failed: {exc}")
                raise PeerError(f"reference rank {self.rank}: {self.broken[peer]}") from None
            if not written:
                outgoing.queue.append(pending)
                if outgoing.writer is None:
                    outgoing.writer = threading.Thread(target=self._write_loop, args=(peer, sock, outgoing),
                                                       daemon=True, name=f"reference-write-r{self.rank}-to{peer}")
                    outgoing.writer.start()
                outgoing.cond.notify()
        if written:
            done(None)
            return None
        return pending

    def _take_back(self, peer: int, frame: _Frame) -> bool:
        """Remove ``frame`` from its peer's queue if none of it is written yet and the writer is not on it."""
        outgoing = self._outgoing[peer]
        with outgoing.cond:
            if frame.started or not outgoing.queue or outgoing.queue[0] is frame or frame not in outgoing.queue:
                return False
            outgoing.queue.remove(frame)
            return True

    def _write_loop(self, peer: int, sock: socket.socket, outgoing: _Outgoing) -> None:
        """Write the queued frames to ``peer`` in order, each by its deadline; the first that misses it or
        fails closes the connection and fails every frame still queued."""
        while True:
            with outgoing.cond:
                while not outgoing.queue and not self._closed:
                    outgoing.cond.wait()
                if not outgoing.queue:
                    return
                frame = outgoing.queue[0]
            try:
                while not _write_now(sock, frame):
                    remaining = None if frame.deadline is None else frame.deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        unsent = sum(len(part) for part in frame.parts)
                        raise TimeoutError(f"{unsent} bytes still unsent at the deadline")
                    select.select([], [sock], [], remaining)
            except (TimeoutError, OSError, ValueError) as exc:  # ValueError: select on a socket close() closed
                self._fail_outgoing(peer, sock, outgoing, exc)
                return
            with outgoing.cond:
                outgoing.queue.popleft()
            frame.done(None)

    def _fail_outgoing(self, peer: int, sock: socket.socket, outgoing: _Outgoing, exc: Exception) -> None:
        if self._closed:
            error: Exception = PeerError(f"reference rank {self.rank}: process group was shut down")
        elif isinstance(exc, TimeoutError):
            self.broken.setdefault(peer, f"send to rank {peer} timed out: {exc}")
            try:  # a frame cut short: nothing later on this connection could be read right
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            error = SendTimeout(f"reference rank {self.rank}: {self.broken[peer]}", peer)
        else:
            self.broken.setdefault(peer, f"send to rank {peer} failed: {exc}")
            error = PeerError(f"reference rank {self.rank}: {self.broken[peer]}")
        with outgoing.cond:
            failed = list(outgoing.queue)
            outgoing.queue.clear()
        for frame in failed:
            frame.done(error)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._conns.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass
        for outgoing in self._outgoing.values():  # a writer waiting for frames ends; one writing fails its frames
            with outgoing.cond:
                outgoing.cond.notify_all()
        self.mailbox.wake()

    @property
    def port(self) -> int:
        return self._listener.port


def _read_hello(sock: socket.socket) -> dict:
    """The meta of a HELLO frame read straight from the socket (nothing after it is read ahead)."""
    kind, _, meta_len, data_len = wire.decode_header(_read_exactly(sock, wire.HEADER.size))
    if kind != wire.HELLO:
        raise wire.ProtocolError(f"first frame is {wire.KINDS[kind]}, not hello")
    if data_len != 0:
        raise wire.ProtocolError(f"hello frame with {data_len} data bytes; a hello has none")
    return wire.decode_meta(_read_exactly(sock, meta_len))


def _read_exactly(source, n: int) -> bytearray:
    """n bytes from a socket or a buffered stream over one; EOFError at a clean end."""
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        chunk = source.recv_into(view[got:], n - got) if isinstance(source, socket.socket) \
            else source.readinto(view[got:])
        if not chunk:
            if got == 0:
                raise EOFError
            raise ClosedMidFrame(f"truncated frame: {got} of {n} bytes before the connection closed")
        got += chunk
    return buffer
