"""RPC frames over the c10d process group under test (agent ``reference-pg``).

The design is PyTorch's ProcessGroupAgent (removed in 1.9): every message is
tagged send/recv on a process group, and one listener thread per rank
receives from any source. The listener delivers in place; a delivery still
busy after ``HANDOVER_S`` (a Future's callback that waits on another RPC)
hands receiving to a fresh listener thread (leader/follower, as reference-tp
does per connection), so a blocked callback never blocks the responses it
waits for. Here the group is created collectively in
``start()`` with ``dist.new_group`` on the default group's backend, so RPC
traffic never shares tags with the default group and the backend under test
(gloo, the project's ``reference``, a vendor's) carries every byte.

One frame is, in this order, from one sender to one receiver (pg_codec.py
encodes, decodes and validates frames; this module moves them):

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

A broken connection to a peer (its process died, or the network reset it) is
noticed by a receive from that peer kept posted on ``WATCH_TAG`` (``_watch``),
which only the byte the peer sends with its STOP completes: gloo fails it when
the pair's connection breaks, the peer is lost and ``on_peer_lost`` fires.
Else it is noticed at the next send to it (gloo and the reference backend both
fail that send, naming the closed connection): the send raises TransportError
naming the rank. c10d fails a receive from any source for nobody, so the
listener cannot notice either; a lost peer counts as closed for shutdown,
which then returns at once and reports (in a warning, ``clean_close = False``)
the listener left blocked in its receive; the group is then left as it is.
Every other wait of a shutdown is bounded by ``SHUTDOWN_JOIN_S``, or by what is left of a graceful
shutdown's timeout when that is shorter (the agent leaves the close at least its CLOSE_GRACE_S).

Over a backend that moves no CPU tensors (a vendor's registered for its device only, as native-dcdev for
dcdev) every message of a frame is staged through this rank's device of that type (``frame_device``): copied
onto it with the device's own copy before it is posted, received into a buffer on it and copied back to the
host. A backend whose devices this process does not have is refused in ``start()`` with an error that says
so, and one without receives from any source fails ``start()`` with its own error, since the listener's first
receives are posted there (NCCL: "ProcessGroupNCCL does not support recvAnysource"). Self-sends never reach a
transport (the agent short-circuits them), which matters because gloo cannot send to its own rank.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .pg_codec import INLINE_CAPACITY, META_BYTES, STOP_KIND, ProtocolError, batch_meta, encode, encode_frame, \
    meta_message, read_frames
from .transport import Deliver, Frame, PeerLost, Transport, TransportError

log = logging.getLogger(__name__)

META_TAG = 7001
BODY_TAG = 7002
WATCH_TAG = 7003  # one byte per peer, sent only at shutdown: the receive posted for it watches the connection
SHUTDOWN_JOIN_S = 10.0  # bound of a shutdown whose peers do not answer
LAST_STOP_GRACE_S = 0.5  # the listener's last steps after the last STOP arrived
START_TIMEOUT_S = 60.0
RECV_DEPTH = 8  # receives from any source kept posted by the listener
HANDOVER_S = 0.02  # a delivery busy this long hands receiving to a fresh listener thread
# Metas to one peer posted and not yet taken before further small frames wait in an
# outbox and leave together, in one batch meta, when one of those completes.
SEND_WINDOW = 2
# Frames posted and not yet taken by their receivers, at most (one frame always passes).
MAX_INFLIGHT_FRAMES = 256
MAX_INFLIGHT_BYTES = 64 << 20
# The listener waits for its next frame for as long as the agent lives: an idle agent is
# not an error. c10d has one timeout per group, and the group connects under it, so the group is
# made under the start timeout and then given this one (PgTransport._connect); every wait of a
# frame's send or receive passes it too, since gloo's receives keep the timeout their group was made
# with (measured on 2.13: a group made with 1 s and set_timeout(7 days) after still timed a receive
# out after 1 s; Work.wait(timeout) is honoured by gloo, the reference and native).
# 7 days: well inside the int32 milliseconds some backends keep. An agent idle longer than
# that loses its listener (the receive times out) and reports every peer lost.
IDLE_TIMEOUT = timedelta(days=7)
# How long past the start timeout start() waits for the backend to make the agent's group (see _connect).
CONNECT_GRACE_S = 0.5

def frame_device(backend: str) -> torch.device | None:
    """Where frames travel over ``backend``: None (the host) when it moves CPU tensors, else this rank's current
    device of a type it moves (torch.accelerator); a backend whose devices this process lacks is refused."""
    devices = dist.Backend.backend_capability.get(str(backend).lower())
    if devices is None or "cpu" in devices:
        return None
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is None or accelerator.type not in devices:
        raise RuntimeError(f"the reference-pg RPC transport sends CPU tensors, or stages them through this rank's "
                           f"accelerator when the backend moves none, and the backend {backend!r} only moves "
                           f"tensors on {devices}, which this process does not have (its accelerator: "
                           f"{accelerator.type if accelerator is not None else 'none'}); run reference-pg where the "
                           "backend's device is, or use the reference-tp agent")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


# --------------------------------------------------------------- transport
class PgTransport(Transport):
    name = "reference-pg"
    shutdown_join_s = SHUTDOWN_JOIN_S
    recv_depth = RECV_DEPTH
    send_window = SEND_WINDOW  # a very large value sends every frame in a meta of its own

    def __init__(self, start_timeout: float = START_TIMEOUT_S) -> None:
        self.start_timeout = start_timeout  # how long start() waits for every rank to announce itself
        self._group: dist.ProcessGroup | None = None  # set once by start(), never reset
        self._wire: torch.device | None = None  # where frames travel: None the host, else staged (frame_device)
        self._rank = -1
        self._world_size = 0
        self._deliver: Deliver | None = None  # set by start(), before the listener starts
        self._on_peer_lost: PeerLost | None = None  # set by start(), before any frame is posted
        self._listener: threading.Thread | None = None  # the thread receiving now (see _read_loop)
        self._busy: tuple | None = None  # (listener, since) while the listener delivers a frame
        self._posted: collections.deque = collections.deque()  # (meta, work): receives from any source
        self._ready: collections.deque = collections.deque()  # (src, frame) received, not yet delivered
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
        self._watches: dict[int, threading.Thread] = {}  # peer -> the thread waiting on its WATCH_TAG receive
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
        self._wire = frame_device(backend)
        group = self._connect(backend)
        self._group = group
        # RECV_DEPTH receives from any source stay posted, so the backend can match an
        # incoming frame at once (gloo hands a send over only once a receive is posted, a
        # rendezvous its own threads then finish without us). The backend matches them in
        # the order they were posted, and the listener takes them in that order: per-peer order
        # holds. Posted here, so a backend that has no such receive fails start() with its error.
        for _ in range(self.recv_depth):
            meta = torch.zeros(META_BYTES, dtype=torch.uint8, device=self._wire)
            self._posted.append((meta, group.recv_anysource([meta], META_TAG)))
        self._listener = threading.Thread(target=self._listen, name=f"reference-pg-listener-r{rank}", daemon=True)
        self._listener.start()
        for peer in self._peers():
            byte = torch.zeros(1, dtype=torch.uint8, device=self._wire)
            work = group.recv([byte], peer, WATCH_TAG)
            self._watches[peer] = threading.Thread(target=self._watch, args=(peer, work, byte), daemon=True,
                                                   name=f"reference-pg-watch-r{rank}-of-r{peer}")
            self._watches[peer].start()

    def _connect(self, backend: str) -> dist.ProcessGroup:
        """The agent's own group over ``backend``, made within ``start_timeout`` or refused naming it.

        c10d has one timeout per group, and a backend that connects while the
        group is made connects under it, so the group is made under the start
        timeout and given IDLE_TIMEOUT once connected. That is not bound
        enough: gloo's connect outlives its timeout (pytorch/gloo#520: the
        side that listens waits with none, the side that dials gives up after
        five times it), and init_rpc over a group made with IDLE_TIMEOUT
        never returned within 7 s of a 2 s RPC timeout under a partition on
        every rank. So the group is made on a thread of its own and given up
        ``CONNECT_GRACE_S`` after the start timeout: start() raises naming the
        backend, and a connect that completes later leaves its group unused
        (the process is expected to end, as after any failed init_rpc).
        A backend that cannot change a group's timeout (c10d's default: "does
        not support setting timeout") gets a second group made with
        IDLE_TIMEOUT right after the first connected: its peers were reachable
        a moment before, and that second connect is the one unbounded step
        left to it.
        """
        made: list[dist.ProcessGroup] = []
        failed: list[BaseException] = []

        def make() -> None:
            try:
                made.append(dist.new_group(backend=backend, timeout=timedelta(seconds=self.start_timeout)))
            except BaseException as exc:  # handed to start(), which raises it
                failed.append(exc)

        maker = threading.Thread(target=make, name=f"reference-pg-connect-r{self._rank}", daemon=True)
        maker.start()
        maker.join(self.start_timeout + CONNECT_GRACE_S)
        if maker.is_alive():
            raise TransportError(f"reference-pg transport of rank {self._rank}: its group over {backend} did not "
                                 f"connect within {self.start_timeout:g} s (the RPC timeout); the backend is still "
                                 "connecting to a peer it cannot reach")
        if failed:
            raise TransportError(f"reference-pg transport of rank {self._rank}: making its group over {backend} "
                                 f"failed: {failed[0]}") from failed[0]
        group = made[0]
        try:
            group.set_timeout(IDLE_TIMEOUT)
        except RuntimeError:
            dist.destroy_process_group(group)
            group = dist.new_group(backend=backend, timeout=IDLE_TIMEOUT)
        return group

    def _host(self, buffer: torch.Tensor) -> torch.Tensor:
        """A received buffer in host memory: staged ones come back with the device's own copy."""
        return buffer if self._wire is None else buffer.cpu()

    def _peers(self) -> list[int]:
        return [peer for peer in range(self._world_size) if peer != self._rank]

    def _rendezvous(self, store) -> None:
        """Every rank announces itself in the agent's store; a missing rank is named, not waited on forever."""
        store.set(f"reference-pg/present/{self._rank}", b"1")
        keys = [f"reference-pg/present/{peer}" for peer in self._peers()]
        try:
            store.wait(keys, timedelta(seconds=self.start_timeout))
        except Exception as exc:
            missing = [peer for peer, key in zip(self._peers(), keys) if not store.check([key])]
            raise TransportError(f"reference-pg transport of rank {self._rank}: ranks {missing} did not start "
                                 f"within {self.start_timeout:g} s ({exc})") from None

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
                    self._post(dst, meta_message(record), None, [], nbytes, 1)
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
        works = []
        group = self._group
        assert group is not None  # a frame is queued only after _check_open found the transport started
        try:
            if self._wire is not None:  # staged: each message onto this rank's device, with its own copy
                meta = meta.to(self._wire)
                body = None if body is None else body.to(self._wire)
                datas = [data.to(self._wire) for data in datas]
            keep = [meta, body, *datas]
            works.append(group.send([meta], dst, META_TAG))
            if body is not None:
                works.append(group.send([body], dst, BODY_TAG))
            for data in datas:
                works.append(group.send([data], dst, BODY_TAG))
        except Exception as exc:
            # Part of a frame may be posted: the stream to dst is unusable from here on.
            self._lose(dst, f"posting a frame to rank {dst} failed: {exc}")
            raise TransportError(f"reference-pg: cannot send to rank {dst}: {exc}") from exc
        self._unfinished[dst] += 1
        self._completer().put((dst, works, keep, nbytes, frames))

    def _await(self, dst: int, works, keep) -> None:
        try:
            for work in works:
                work.wait(IDLE_TIMEOUT)
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
            assert self._on_peer_lost is not None  # a peer is lost only once start() posted or received
            self._on_peer_lost(peer, reason)

    # ------------------------------------------------------------ receive
    def _listen(self) -> None:
        threading.Thread(target=self._monitor, name=f"reference-pg-monitor-r{self._rank}", daemon=True).start()
        self._read_loop()

    def _read_loop(self) -> None:
        """Receive and deliver frames while this thread is the listener.

        Leader/follower, as reference-tp: a delivery may block (a response
        completes a Future whose ``then`` callback waits on another RPC); the
        monitor then makes a fresh thread the listener, which delivers the
        frames still ready (``_ready``, per-peer order kept) and receives on,
        and this thread ends once its delivery returns. Only the listener
        touches ``_posted`` and ``_ready``.
        """
        me = threading.current_thread()
        group, posted, ready = self._group, self._posted, self._ready
        assert group is not None  # listeners run only after start() set the group
        while True:
            if not ready:
                try:
                    meta, work = posted.popleft()
                    work.wait(IDLE_TIMEOUT)
                    src = work._source_rank()
                    raw = self._host(meta).numpy().tobytes()  # a copy: the buffer is posted again right away
                    posted.append((meta, group.recv_anysource([meta], META_TAG)))
                except Exception as exc:
                    self._listener_failed(f"receiving from any rank failed: {exc}")
                    return
                self.metas_received += 1
                try:
                    ready.extend((src, frame) for frame in self._read_rest(group, src, raw))
                except ProtocolError as exc:
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
                continue
            src, frame = ready.popleft()
            if frame is None:  # STOP (always alone in its meta)
                if self._peer_stopped(src):
                    return
                continue
            self.frames_received += 1
            if self._dropping:
                continue
            self._busy = (me, time.monotonic())
            assert self._deliver is not None  # start() set it before the first listener started
            try:
                self._deliver(src, frame)
            except Exception:  # the agent's bug must not kill the only receiver
                log.exception("reference-pg: deliver() raised for a frame from rank %d", src)
            with self._state:
                if self._listener is not me:
                    return  # handed over while delivering: the new listener goes on
                self._busy = None

    def _watch(self, peer: int, work, byte: torch.Tensor) -> None:
        """Wait on the receive posted from ``peer`` on WATCH_TAG, which only the byte it sends at shutdown completes.

        The listener's receives are from any source, which no backend fails for one broken connection, and a send
        whose bytes left before the connection was reset has completed: without this receive a reset connection is
        noticed only at the next send to that peer, and the calls waiting for its answers run into their timeout
        (measured with gloo under a cut after N bytes at world size 3, six runs: the cut-off rank's calls did in 4,
        with this receive in none of six). gloo fails every pending receive of a pair whose connection broke, so the
        peer is lost at once, its calls failed naming it, as TensorPipe fails a reset pipe's. A rank the reset never
        reaches still waits (backends/rpc_agents.py, the cut_after_bytes gap)."""
        try:
            work.wait(IDLE_TIMEOUT)
        except Exception as exc:
            with self._state:
                closing = self._dropping or peer in self._stop_received
            if not closing:
                self._lose(peer, f"the connection to rank {peer} failed: {exc}")
        del byte  # referenced until the receive ended

    def _monitor(self) -> None:
        """Make a fresh thread the listener when the listener has been delivering for HANDOVER_S."""
        while not self._dropping:
            time.sleep(HANDOVER_S)
            with self._state:
                busy, listener = self._busy, self._listener
                if listener is None or not listener.is_alive():
                    return  # the listener ended (every peer stopped, or it failed): nothing to hand on
                if busy is None or busy[0] is not listener or time.monotonic() - busy[1] < HANDOVER_S:
                    continue
                self._busy = None
                self._listener = threading.Thread(target=self._read_loop, daemon=True,
                                                  name=f"reference-pg-listener-r{self._rank}")
                self._listener.start()

    def _read_rest(self, group, src: int, raw: bytes) -> list:
        def receive(nbytes: int) -> torch.Tensor:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=self._wire)
            group.recv([buffer], src, BODY_TAG).wait(IDLE_TIMEOUT)
            return self._host(buffer)

        return read_frames(raw, src, receive)

    def _peer_stopped(self, src: int) -> bool:
        """``src`` sent its last frame to us. Answer with our STOP; True when every peer is done."""
        with self._state:
            self._stop_received.add(src)
            was_shutting_down = self._shutting_down
            self._closed_reason.setdefault(src, f"rank {src} has shut down its RPC transport")
        if not was_shutting_down:
            assert self._on_peer_lost is not None  # a STOP is read only by a listener start() started
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
                group = self._group
                assert group is not None  # _check_open raised if the transport was never started
                if self._wire is not None:
                    meta = meta.to(self._wire)
                work = group.send([meta], dst, META_TAG)
                # ends the peer's watch of this connection (_watch): from here on its closing is no loss
                goodbye = torch.ones(1, dtype=torch.uint8, device=self._wire)
                said = group.send([goodbye], dst, WATCH_TAG)
            except TransportError:
                return  # the peer is unreachable: it needs no STOP from us
            except Exception as exc:
                self._lose(dst, f"posting a STOP to rank {dst} failed: {exc}")
                return
        with self._state:
            self._stop_works.append((dst, [work, said], [meta, goodbye]))

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
    def shutdown(self, within_s: float | None = None) -> None:
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
        # a graceful shutdown's timeout bounds the close handshake too: a peer behind a silent partition never answers
        # (measured: shutdown(graceful=True, timeout=2) took 12 s, its 2 s and then SHUTDOWN_JOIN_S for the STOPs)
        bound_s = self.shutdown_join_s if within_s is None else min(self.shutdown_join_s, within_s)
        deadline = time.monotonic() + bound_s
        assert self._listener is not None  # start() set it with the group; it is replaced, never cleared
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
            assert completer is not None  # set together with completions, under the same lock
            completions.put(None)
            completer.join(max(0.0, deadline - time.monotonic()))
            if completer.is_alive():
                problems.append("frames posted before the STOPs were not taken")
        if not _wait_all([w for _, works, _ in stop_works for w in works], max(0.0, deadline - time.monotonic())):
            problems.append(f"STOP frames to some peers were not taken within {bound_s:g} s")
        with self._state:
            stopped = set(self._stop_received)
        for peer, watch in self._watches.items():  # a goodbye follows its STOP; a lost peer's may never come
            if peer in stopped:
                watch.join(max(0.0, deadline - time.monotonic()))
        watching = sorted(peer for peer, watch in self._watches.items() if watch.is_alive())
        if watching:
            problems.append(f"no goodbye on the watch of ranks {watching}: its receives stay posted")
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
