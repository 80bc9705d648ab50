"""The reference RPC agent: what messages mean, over any Transport.

Caller side: ``call`` pickles (target, args, kwargs, flags) with the tensors
taken out (serialize.py), files a pending entry under a fresh message id,
sends, and returns a torch Future that the response completes straight from
the thread that read it. A watchdog fails calls that outlive their timeout
(torch's text); a response that comes later finds no entry and is dropped.

Callee side: a request runs on a worker: inline on the transport's reader
thread when the transport allows it (reference-tp hands its connection to a
new reader if the work blocks) and a pool slot is free, else on one of the
``num_worker_threads`` pool threads. At most ``num_worker_threads`` requests
run at once. Exceptions travel back as (type, torch's text) and are logged
here; an ``@async_execution`` function's Future is chained, holding no slot.

RRef bookkeeping (rref.py explains the rule) is ``OwnerTable``; its
messages are handled in delivery order, before any later frame of the peer.

Graceful shutdown is a termination detection over the store: every worker,
once locally idle, publishes its counts of messages sent and received; two
consecutive rounds with equal, balanced totals mean nothing is in flight.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import pickle
import queue
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
from torch._C._distributed_rpc import WorkerInfo

from . import builtin_ops, profiling, serialize
from .autograd import service as autograd
from .rref import RRef
from .transport import Frame, Kind

log = logging.getLogger(__name__)

K_SCRIPT_CALL, K_PYTHON_CALL = int(Kind.SCRIPT_CALL), int(Kind.PYTHON_CALL)
K_SCRIPT_REMOTE, K_PYTHON_REMOTE = int(Kind.SCRIPT_REMOTE_CALL), int(Kind.PYTHON_REMOTE_CALL)
K_FETCH = int(Kind.PYTHON_RREF_FETCH_CALL)
K_USER_DELETE, K_FORK_REQUEST = int(Kind.RREF_USER_DELETE), int(Kind.RREF_FORK_REQUEST)
K_PYTHON_RET, K_REMOTE_RET, K_FETCH_RET = int(Kind.PYTHON_RET), int(Kind.REMOTE_RET), int(Kind.PYTHON_RREF_FETCH_RET)
K_EXCEPTION = int(Kind.EXCEPTION)
CALLS = frozenset((K_SCRIPT_CALL, K_PYTHON_CALL))
REMOTES = frozenset((K_SCRIPT_REMOTE, K_PYTHON_REMOTE))
# distributed autograd (autograd/service.py): an RPC wrapped with its context, and the autograd requests
K_FORWARD_REQ, K_FORWARD_RESP = autograd.K_FORWARD_REQ, autograd.K_FORWARD_RESP
REQUESTS = CALLS | REMOTES | {K_FETCH, K_FORWARD_REQ} | autograd.SERVED
RESPONSES = frozenset(int(k) for k in (Kind.SCRIPT_RET, Kind.PYTHON_RET, Kind.REMOTE_RET, Kind.SCRIPT_RREF_FETCH_RET,
                                       Kind.PYTHON_RREF_FETCH_RET, Kind.RREF_ACK, Kind.EXCEPTION,
                                       Kind.FORWARD_AUTOGRAD_RESP))

WATCHDOG_TICK_S = 0.02
ID_BITS = 40  # message ids below 2**40 share a deadline heap entry with their deadline
ID_MASK = (1 << ID_BITS) - 1
IDLE_POLL_S = 0.002

# torch's texts (torch/csrc/distributed/rpc/rpc_agent.h kRpcTimeoutErrorStr with the
# "RPCErr:1:" prefix of RPCErrorType::TIMEOUT, as TensorPipe's rpc_sync raises it)
TIMEOUT_TEXT = "RPCErr:1:RPC ran for more than set timeout ({} ms) and will now be marked with an error"
# torch/csrc/distributed/rpc/python_functions.cpp (async_execution result check)
NOT_A_FUTURE = ("Functions decorated with @rpc.async_function must return a torch.futures.Future object, "
                "but got {}")
# torch/distributed/rpc/internal.py deserialize(): a function the callee cannot find
UDF_NOT_FOUND = (" Default RPC pickler does not serialize\n            function code. Ensure that UDFs are "
                 "defined on both caller and callee modules.")


def _timeout_ms(seconds: float) -> int:
    return int(seconds * 1000)


def remote_exception(info, exc: BaseException) -> tuple[type, str]:
    """(type, text) as torch's internal._run_function formats a UDF's exception (and logs it)."""
    text = f"On {info}:\n{repr(exc)}\n{traceback.format_exc()}"
    print(text, file=sys.stderr)
    return type(exc), text


def raise_remote(exc_type: type, text: str) -> BaseException:
    """The caller's exception: the original type with torch's text ("ValueError: On WorkerInfo...")."""
    try:  # torch's internal._handle_exception decodes the text: repr's "\\n" becomes a line break
        text = text.encode("utf-8").decode("unicode_escape")
    except UnicodeDecodeError as exc:  # a stray backslash: torch's caller raises this too
        return exc
    message = f"{getattr(exc_type, '__name__', 'Exception')}: {text}"
    try:
        return exc_type(message)
    except BaseException as exc:  # torch's internal._handle_exception fallback
        return RuntimeError(f"Failed to create original exception type. Error msg was {exc} "
                            f"Original exception on remote side was {message}")


def resolve_target(target):
    """The callable a request names: a pickled Python function, a torch builtin or a TorchScript function."""
    if type(target) is not tuple:
        return target
    what, name = target
    if what == "builtin":
        return builtin_ops.resolve(name)  # the operator, not math.cos that shares its name
    fn = torch.jit._state._python_cu.find_function(name)
    if fn is None:
        raise RuntimeError(f"Unknown TorchScript function {name}: define it (@torch.jit.script) on the callee too")
    return fn


_RESOLVED: dict = {}  # a function's pickle -> the function, resolved once per process


def resolve_key(key: bytes):
    """The callable a cached-by-name target pickle names (see calls.target_of)."""
    func = _RESOLVED.get(key)
    if func is None:
        try:
            func = resolve_target(pickle.loads(key))
        except AttributeError as exc:  # torch's internal.deserialize() addition
            raise AttributeError(str(exc) + UDF_NOT_FOUND) from exc
        if len(_RESOLVED) < 100_000:
            _RESOLVED[key] = func
    return func


class SyncWaiter:
    """What rpc_sync waits on: a lock released by the response (a torch Future costs more)."""

    __slots__ = ("_lock", "_value", "_error")

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._value = self._error = None

    def set_result(self, value) -> None:
        self._value = value
        self._lock.release()

    def set_exception(self, error) -> None:
        self._error = error
        self._lock.release()

    def wait(self):
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        return self._value


class Pending:
    __slots__ = ("future", "call", "dst", "timeout", "rref")

    def __init__(self, future, call, dst, timeout, rref=None):
        self.future, self.call, self.dst, self.timeout, self.rref = future, call, dst, timeout, rref


class OwnerEntry:
    __slots__ = ("value", "users", "tombstones", "created")

    def __init__(self):
        self.value = torch.futures.Future()
        self.users: set = set()
        self.tombstones: set = set()
        self.created = False


class OwnerTable:
    """This worker's owned values and the fork bookkeeping of every RRef (see rref.py)."""

    def __init__(self, agent):
        self.agent = agent
        self.lock = threading.Lock()
        self.owned: dict[tuple, OwnerEntry] = {}
        self.released: queue.SimpleQueue = queue.SimpleQueue()  # (owner, rref_id, fork_id) from __del__
        self._ids = itertools.count(1)

    def new_id(self) -> tuple:
        return (self.agent.rank, next(self._ids))

    def _entry(self, rref_id) -> OwnerEntry:
        entry = self.owned.get(rref_id)
        if entry is None:
            entry = self.owned[rref_id] = OwnerEntry()
        return entry

    # ------------------------------------------------ owner-side changes
    def _maybe_free(self, rref_id, entry: OwnerEntry) -> None:
        """Drop a value no fork refers to any more (under the lock)."""
        if entry.created and not entry.users and not entry.tombstones and self.owned.get(rref_id) is entry:
            del self.owned[rref_id]

    def add_fork(self, rref_id, fork_id) -> OwnerEntry:
        with self.lock:
            entry = self._entry(rref_id)
            if fork_id in entry.tombstones:  # its delete came first: the two cancel out
                entry.tombstones.discard(fork_id)
                self._maybe_free(rref_id, entry)
            else:
                entry.users.add(fork_id)
            return entry

    def delete_fork(self, rref_id, fork_id) -> None:
        with self.lock:
            entry = self._entry(rref_id)
            if fork_id in entry.users:
                entry.users.discard(fork_id)
                self._maybe_free(rref_id, entry)
            else:
                entry.tombstones.add(fork_id)

    def created(self, rref_id) -> OwnerEntry:
        """The value's creation ran (remote() or RRef(value)); the caller sets it on the returned entry."""
        with self.lock:
            entry = self._entry(rref_id)
            entry.created = True
            self._maybe_free(rref_id, entry)  # every fork may be gone already
            return entry

    def owned_count(self) -> int:
        with self.lock:
            return len(self.owned)

    # ------------------------------------------------ RRef objects
    def adopt_local(self, rref: RRef, value) -> None:
        """``RRef(value)``: an owner RRef to a local value."""
        rref_id = self.new_id()
        fork_id = self.new_id()
        rref._agent, rref.rref_id, rref.fork_id = self.agent, rref_id, fork_id
        rref._owner, rref._is_owner, rref._creation, rref._confirmed, rref._error = \
            self.agent.rank, True, None, True, None
        entry = self.add_fork(rref_id, fork_id)
        self.created(rref_id)
        entry.value.set_result(value)

    def fork(self, rref: RRef) -> tuple:
        """A new fork of ``rref`` for a message being pickled; registered before the message goes."""
        agent = self.agent
        if agent is not rref._agent or agent.stopped:
            raise RuntimeError(f"{rref} belongs to an RPC agent that was shut down")
        child = self.new_id()
        if rref._is_owner:
            self.add_fork(rref.rref_id, child)
        else:
            agent.send_control(rref._owner, K_FORK_REQUEST, (rref.rref_id, child))
        return (rref.rref_id, child, rref._owner, rref.confirmed_by_owner())

    def new_user(self, owner: int) -> RRef:
        """The caller's RRef to the value a remote() is about to create on ``owner`` (unconfirmed)."""
        return RRef._make(self.agent, self.new_id(), self.new_id(), owner, confirmed=False)

    def from_fork(self, rref_id, fork_id, owner, confirmed) -> RRef:
        return RRef._make(self.agent, rref_id, fork_id, owner, confirmed or owner == self.agent.rank)

    def release(self, rref: RRef) -> None:
        """An RRef object is gone (called from __del__: only queue, never send here)."""
        if self.agent.stopped:
            return
        self.released.put((rref._owner, rref.rref_id, rref.fork_id))

    def flush_released(self) -> None:
        while True:
            try:
                owner, rref_id, fork_id = self.released.get_nowait()
            except queue.Empty:
                return
            if owner == self.agent.rank:
                self.delete_fork(rref_id, fork_id)
            else:
                try:
                    self.agent.send_control(owner, K_USER_DELETE, (rref_id, fork_id))
                except Exception as exc:  # the owner is gone: nothing left to free there
                    log.debug("RRef delete to rank %s not sent: %s", owner, exc)

    def local_value(self, rref_id):
        with self.lock:
            entry = self.owned.get(rref_id)
        if entry is None:
            raise RuntimeError(f"RRef {rref_id} has no value on its owner {self.agent.info}")
        try:
            return entry.value.wait()
        except _Failure as exc:  # remote() failed: the owner raises the creation's error, as torch's OwnerRRef
            raise raise_remote(*exc.failure) from None


class Agent:
    def __init__(self, name: str, rank: int, world_size: int, options, store, transport):
        self.info = WorkerInfo(name, rank)
        self.name, self.rank, self.world_size = name, rank, world_size
        self.options = options
        self.default_timeout = float(options.rpc_timeout)
        self.store = store
        self.transport = transport
        self.workers: list = []
        self.by_name: dict = {}
        self.rrefs = OwnerTable(self)
        self.stopped = False
        self._pending: dict[int, Pending] = {}
        self._ids = itertools.count(1)
        self._wake_watchdog = threading.Event()
        # heap of one int per armed call, (deadline in us since _t0) << ID_BITS | msg_id: a third of the
        # memory of (deadline, msg_id) tuples, which stay until their deadline whether answered or not.
        # heappush/heappop of ints are single C calls under the GIL: no lock.
        self._deadlines: list = []
        self._t0 = time.monotonic()
        self._sent = itertools.count()  # counters read through repr(): next() is atomic, += is not
        self._received = itertools.count()
        self._finished = itertools.count()
        self._send_failures = itertools.count()
        self._backlog: queue.SimpleQueue = queue.SimpleQueue()
        self._slots: queue.SimpleQueue = queue.SimpleQueue()
        for slot in range(options.num_worker_threads):
            self._slots.put(slot)
        self._inline = bool(getattr(transport, "runs_inline", False))
        # (caller rank, msg id) -> autograd context id of a request that came inside a context:
        # its function runs in that context and its response is recorded in it
        self._autograd_requests: dict[tuple, int] = {}
        self._threads: list[threading.Thread] = []

    # ================================================================ life
    def start(self) -> None:
        store, rank = self.store, self.rank
        store.set(f"agent/name/{rank}", self.name)
        names = [store.get(f"agent/name/{r}").decode() for r in range(self.world_size)]
        seen: dict[str, int] = {}
        for r, name in enumerate(names):
            if name in seen:
                raise RuntimeError(f"RPC worker name {name!r} is used by ranks {seen[name]} and {r}; "
                                   "every worker needs a unique name")
            seen[name] = r
        self.workers = [WorkerInfo(name, r) for r, name in enumerate(names)]
        self.by_name = {info.name: info for info in self.workers}
        for i in range(self.options.num_worker_threads):
            self._spawn(self._pool_loop, f"rpc-worker-{i}")
        self._spawn(self._watchdog, "rpc-watchdog")
        self.transport.start(rank, self.world_size, store, self._deliver, self._peer_lost)

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=f"{name}-r{self.rank}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def shutdown(self, graceful: bool = True, timeout: float = 0) -> None:
        try:
            if graceful:
                self._wait_all_workers(timeout)
        finally:
            self._stop()

    def _stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._wake_watchdog.set()
        try:
            self.transport.shutdown()
        finally:
            for _ in range(self.options.num_worker_threads):
                self._backlog.put(None)
            error = RuntimeError(f"RPC agent {self.info} was shut down before the call completed")
            for msg_id in list(self._pending):
                entry = self._pending.pop(msg_id, None)
                if entry is not None:
                    self._fail(entry, error)
            with self.rrefs.lock:
                self.rrefs.owned.clear()

    @staticmethod
    def _count(counter) -> int:
        return int(repr(counter)[6:-1])

    def _idle(self) -> bool:
        return not self._pending and self._count(self._received) == self._count(self._finished) \
            and self._backlog.empty()

    def _wait_all_workers(self, timeout: float) -> None:
        """Return when no worker has outstanding work (torch's _wait_all_workers, over the store)."""
        deadline = time.monotonic() + timeout if timeout and timeout > 0 else None
        previous = None
        for round_ in itertools.count():
            while True:  # locally idle first: a busy worker's counts are about to change
                self.rrefs.flush_released()
                if self._idle():
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"{self.info}: RPC shutdown timed out after {timeout:g} s with "
                                       f"{len(self._pending)} calls outstanding")
                time.sleep(IDLE_POLL_S)
            sent = self._count(self._sent) - self._count(self._send_failures)
            self.store.set(f"shutdown/{round_}/{self.rank}", f"{sent},{self._count(self._received)}")
            keys = [f"shutdown/{round_}/{r}" for r in range(self.world_size)]
            if deadline is not None:
                self.store.wait(keys, timedelta(seconds=max(0.001, deadline - time.monotonic())))
            else:
                self.store.wait(keys)
            counts = [tuple(int(x) for x in self.store.get(key).decode().split(",")) for key in keys]
            totals = (sum(c[0] for c in counts), sum(c[1] for c in counts))
            if totals[0] == totals[1] and totals == previous:
                return
            previous = totals

    # ============================================================ caller
    def worker_info(self, to) -> WorkerInfo:
        """torch's _to_worker_info with the agent's lookup texts (tensorpipe_agent.cpp getWorkerInfo)."""
        if type(to) is str:  # the common cases first: a name, a rank
            info = self.by_name.get(to)
            if info is not None:
                return info
        elif type(to) is int and 0 <= to < self.world_size:
            return self.workers[to]
        if isinstance(to, WorkerInfo):
            if not 0 <= to.id < self.world_size:
                raise RuntimeError(f"name:{self.name},rank:{self.rank} could not find destination id {to.id}")
            return self.workers[to.id]
        if isinstance(to, str):
            info = self.by_name.get(to)
            if info is None:
                raise RuntimeError(f"name:{self.name},rank:{self.rank} could not find destination name {to}")
            return info
        if isinstance(to, int):
            if not 0 <= to < self.world_size:
                raise RuntimeError(f"name:{self.name},rank:{self.rank} could not find destination id {to}")
            return self.workers[to]
        raise ValueError(f"Cannot get WorkerInfo from name {to}")  # torch's api._to_worker_info

    def call(self, dst: int, kind: int, key, target, args, kwargs, async_exec: bool, timeout: float,
             call=None, rref: RRef | None = None, sync: bool = False) -> torch.futures.Future:
        """Send one request; the Future completes with its response (or error).

        ``sync``: the caller only waits (rpc_sync, profiler off): a SyncWaiter,
        cheaper than a torch Future, stands in for it.
        """
        if self.stopped:
            raise RuntimeError("RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.")
        if timeout < 0:  # UNSET
            timeout = self.default_timeout
        extra = None
        if call is not None:
            extra = profiling.request_fields(call)
        remote_ids = (rref.rref_id, rref.fork_id) if rref is not None else None
        payload = (key, target, args, kwargs, async_exec, extra, remote_ids)
        if autograd.current_context_id() == -1:
            header, tensors = serialize.dumps(payload)
        else:  # inside a distributed autograd context: maybe FORWARD_AUTOGRAD_REQ with a send function
            kind, header, tensors = autograd.wrap_request(self, dst, kind, key, payload)
        future = SyncWaiter() if sync else torch.futures.Future()
        msg_id = next(self._ids)
        self._pending[msg_id] = Pending(future, call, dst, timeout, rref)
        if timeout > 0:
            self._arm(time.monotonic() + timeout, msg_id)
        self._send(dst, Frame(kind, msg_id, header, tensors), msg_id)
        return future

    def _arm(self, deadline: float, msg_id: int) -> None:
        deadlines = self._deadlines
        key = (int((deadline - self._t0) * 1e6) << ID_BITS) | msg_id
        if not deadlines or key < deadlines[0]:
            self._wake_watchdog.set()  # rare: a deadline earlier than every armed one
        heapq.heappush(deadlines, key)

    def fetch(self, rref: RRef, timeout: float) -> torch.futures.Future:
        """to_here() of a user RRef: PYTHON_RREF_FETCH_CALL to its owner.

        A remote() not yet confirmed is waited for first (within this call's
        timeout): if its creation failed or timed out, to_here raises that error,
        as TensorPipe does.
        """
        if self.stopped:
            raise RuntimeError("RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.")
        if rref._error is not None:
            raise rref._error
        if timeout < 0:
            timeout = self.default_timeout
        kind = K_FETCH
        if autograd.current_context_id() == -1:
            header, tensors = serialize.dumps(rref.rref_id)
        else:  # a fetch always carries the context (torch's forceGradRecording)
            kind, header, tensors = autograd.wrap_request(self, rref._owner, K_FETCH, None, rref.rref_id)
        future = torch.futures.Future()
        msg_id = next(self._ids)
        self._pending[msg_id] = Pending(future, None, rref._owner, timeout)
        if timeout > 0:
            self._arm(time.monotonic() + timeout, msg_id)
        frame = Frame(kind, msg_id, header, tensors)
        creation = rref._creation
        if creation is None or creation.done():
            self._send(rref._owner, frame, msg_id)
            return future

        def created(_):
            if rref._error is not None:
                entry = self._pending.pop(msg_id, None)
                if entry is not None:
                    entry.future.set_exception(rref._error)
                return
            if msg_id in self._pending:
                with profiling.unrecorded():  # may run inside the caller's profiled callbacks
                    self._send(rref._owner, frame, msg_id)

        creation.add_done_callback(created)
        return future

    def request(self, dst: int, kind: int, header: bytes, tensors: list, timeout: float = -1.0):
        """A request whose header is already encoded (the autograd requests); a Future of its response value."""
        if self.stopped:
            raise RuntimeError("RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.")
        if timeout < 0:
            timeout = self.default_timeout
        future = torch.futures.Future()
        msg_id = next(self._ids)
        self._pending[msg_id] = Pending(future, None, dst, timeout)
        if timeout > 0:
            self._arm(time.monotonic() + timeout, msg_id)
        self._send(dst, Frame(kind, msg_id, header, tensors), msg_id)
        return future

    def send_control(self, dst: int, kind: int, payload) -> None:
        """A fire-and-forget RRef message (no response)."""
        header, tensors = serialize.dumps(payload)
        self._send(dst, Frame(kind, 0, header, tensors), None)

    def _send(self, dst: int, frame: Frame, msg_id) -> None:
        next(self._sent)
        if dst == self.rank:  # self: skip the transport, still through the pool, tensors copied
            next(self._received)
            local = Frame(frame.kind, frame.msg_id, frame.header, serialize.self_copy(frame.tensors))
            if local.kind in REQUESTS:
                self._accept_request(dst, local, inline=False)
            else:
                self._control(dst, local)
            return
        try:
            self.transport.send(dst, frame)
        except Exception as exc:
            next(self._send_failures)
            entry = self._pending.pop(msg_id, None) if msg_id is not None else None
            if entry is not None:
                self._fail(entry, RuntimeError(f"RPC to {self.workers[dst]} failed: {exc}"))
            if msg_id is None or entry is None:
                raise

    def _fail(self, entry: Pending, error: BaseException) -> None:
        if entry.call is not None:
            profiling.absorb_response(entry.call, None)
        if entry.rref is not None and entry.rref._error is None:
            entry.rref._error = error
        entry.future.set_exception(error)

    def _peer_lost(self, peer: int, reason: str) -> None:
        name = self.workers[peer] if peer < len(self.workers) else peer
        for msg_id, entry in list(self._pending.items()):
            if entry.dst == peer:
                entry = self._pending.pop(msg_id, None)
                if entry is not None:
                    self._fail(entry, RuntimeError(f"RPC to {name} failed: {reason}"))

    def _watchdog(self) -> None:
        deadlines, pending, wake = self._deadlines, self._pending, self._wake_watchdog
        while not self.stopped:
            # sleep until the earliest deadline (at most a tick: RRef deletes are flushed then)
            pause = WATCHDOG_TICK_S
            if deadlines:
                pause = min(pause, (deadlines[0] >> ID_BITS) / 1e6 + self._t0 - time.monotonic())
            if pause > 0:
                wake.wait(pause)
            wake.clear()
            if not self.rrefs.released.empty():
                self.rrefs.flush_released()
            now_key = (int((time.monotonic() - self._t0) * 1e6) + 1) << ID_BITS
            while deadlines and deadlines[0] < now_key:
                msg_id = heapq.heappop(deadlines) & ID_MASK
                entry = pending.pop(msg_id, None)
                if entry is None:
                    continue  # answered in time
                error = RuntimeError(TIMEOUT_TEXT.format(_timeout_ms(entry.timeout)))
                self._fail(entry, error)  # a remote(): its RRef keeps the error for to_here

    # ========================================================== delivery
    def _deliver(self, src: int, frame: Frame) -> None:
        """Every frame from a peer, in its order (transport thread)."""
        kind = frame.kind
        if kind in RESPONSES:
            self._response(frame)
            return
        next(self._received)
        if kind in REQUESTS:
            self._accept_request(src, frame, self._inline)
        else:
            self._control(src, frame)

    def _control(self, src: int, frame: Frame) -> None:
        kind = frame.kind
        if kind in RESPONSES:  # a self-call's response
            self._response(frame)
            return
        try:
            rref_id, fork_id = serialize.loads(frame.header, frame.tensors)
            if kind == K_FORK_REQUEST:
                self.rrefs.add_fork(tuple(rref_id), tuple(fork_id))
            elif kind == K_USER_DELETE:
                self.rrefs.delete_fork(tuple(rref_id), tuple(fork_id))
            else:
                log.warning("%s: unexpected message kind %s from rank %s ignored", self.info, kind, src)
        except Exception:
            log.exception("%s: bad RRef message from rank %s", self.info, src)
        finally:
            next(self._finished)

    def _accept_request(self, src: int, frame: Frame, inline: bool) -> None:
        if frame.kind == K_FORWARD_REQ:
            # unwrapped in delivery order: the recv function exists before anything runs
            try:
                frame, context_id = autograd.unwrap_request(self, src, frame)
            except Exception as exc:
                self._refuse(src, frame, exc)
                return
            self._autograd_requests[(src, frame.msg_id)] = context_id
        if frame.kind in REMOTES:
            # decoded here, in delivery order: the caller's fork must be registered
            # before any later delete from that caller (rref.py)
            job = (src, frame, self._decode(frame))
            if not isinstance(job[2], BaseException) and job[2][6] is not None:
                rref_id, fork_id = job[2][6]
                self.rrefs.add_fork(tuple(rref_id), tuple(fork_id))
        else:
            job = (src, frame, None)
        if inline:
            try:
                slot = self._slots.get_nowait()
            except queue.Empty:
                self._backlog.put(job)
                return
            try:
                self._handle(*job)
            finally:
                self._slots.put(slot)
        else:
            self._backlog.put(job)

    def _pool_loop(self) -> None:
        backlog, slots = self._backlog, self._slots
        while True:
            job = backlog.get()
            if job is None:
                return
            slot = slots.get()
            try:
                self._handle(*job)
            except Exception:
                log.exception("%s: request handling failed", self.info)
            finally:
                slots.put(slot)

    def _decode(self, frame: Frame):
        try:
            return serialize.loads(frame.header, frame.tensors)
        except AttributeError as exc:  # torch's internal.deserialize() addition
            error = AttributeError(str(exc) + UDF_NOT_FOUND)
            error.__cause__ = exc
            return error
        except BaseException as exc:
            return exc

    def _refuse(self, src: int, frame: Frame, exc: BaseException) -> None:
        """A malformed request: answer it with the reason (naming the sender), log it, keep serving."""
        what = autograd.NAMES.get(frame.kind, f"kind {frame.kind}")
        text = f"{self.info} refused a malformed {what} from {self._name_of(src)}: {exc}"
        log.warning("%s", text)
        try:
            self._respond_error(src, frame.msg_id, (RuntimeError, text))
        finally:
            next(self._finished)

    def _name_of(self, rank: int):
        return self.workers[rank] if 0 <= rank < len(self.workers) else f"rank {rank}"

    # ============================================================ callee
    def _handle(self, src: int, frame: Frame, decoded) -> None:
        if frame.kind in autograd.SERVED:
            self._serve_autograd(src, frame)
            return
        context_id = self._autograd_requests.get((src, frame.msg_id)) if self._autograd_requests else None
        if context_id is None:
            self._handle_call(src, frame, decoded)
            return
        with autograd.forced_context(context_id):  # nested RPCs of this request carry its context
            self._handle_call(src, frame, decoded)

    def _serve_autograd(self, src: int, frame: Frame) -> None:
        """A propagate-gradients, clean-up or RRef-backward request: answered when its work is done."""
        msg_id = frame.msg_id
        try:
            fut = autograd.serve(self, src, frame)
        except Exception as exc:
            self._refuse(src, frame, exc)
            return

        def answer(done):
            try:
                self._respond(src, msg_id, K_PYTHON_RET, autograd.outcome_text(done), None)
            finally:
                next(self._finished)

        fut.add_done_callback(answer)

    def _handle_call(self, src: int, frame: Frame, decoded) -> None:
        kind, msg_id = frame.kind, frame.msg_id
        if kind == K_FETCH:
            self._serve_fetch(src, msg_id, frame)  # counts itself finished when it answers
            return
        chained = False  # True once a callback owns the answer (and the finished count)
        try:
            if decoded is None:
                decoded = self._decode(frame)
            if isinstance(decoded, BaseException):
                try:
                    raise decoded
                except BaseException as exc:
                    failure = remote_exception(self.info, exc)
                self._respond_error(src, msg_id, failure)
                return
            key, target, args, kwargs, async_exec, prof, remote_ids = decoded
            if prof is None and not async_exec and remote_ids is None:
                # the hot path: run, answer
                try:
                    value = (_RESOLVED.get(key) or resolve_key(key) if key is not None
                             else resolve_target(target))(*args, **kwargs)
                except Exception as exc:
                    self._respond_error(src, msg_id, remote_exception(self.info, exc))
                    return
                self._respond(src, msg_id, K_PYTHON_RET, value, None)
                return
            run = lambda: self._run_to_future(key, target, args, kwargs, async_exec)  # noqa: E731
            fut = profiling.run_profiled(prof, run) if prof is not None else run()
            chained = True
            fut.add_done_callback(lambda done: self._finish(src, msg_id, remote_ids, prof is not None, done))
        except Exception:  # a bug here must still answer the caller
            if not chained:
                self._respond_error(src, msg_id, remote_exception(self.info, sys.exc_info()[1]))
            else:
                log.exception("%s: request %s failed after chaining", self.info, msg_id)
        finally:
            if not chained:
                next(self._finished)

    def _run_to_future(self, key, target, args, kwargs, async_exec: bool):
        fut = torch.futures.Future()
        func = None
        try:
            func = resolve_key(key) if key is not None else resolve_target(target)
            value = func(*args, **kwargs)
        except Exception as exc:
            failure = remote_exception(self.info, exc)
            if func is not None and _is_python_udf(func):
                # torch's internal._run_function: a Python function's exception is the
                # request's *value* (RemoteException), so a profiled call still brings
                # its events back; a builtin's or TorchScript's is the request's error
                fut.set_result(_UdfRaised(failure))
            else:
                fut.set_exception(_Failure(failure))
            return fut
        if not async_exec:
            fut.set_result(value)
            return fut
        if not isinstance(value, torch._C.Future):
            name = f"{type(value).__module__}.{type(value).__qualname__}"
            fut.set_exception(_Failure((RuntimeError, NOT_A_FUTURE.format(name))))
            return fut
        return value

    def _finish(self, src: int, msg_id: int, remote_ids, profiled: bool, done) -> None:
        """A chained (async_execution, profiled or remote) request completed: answer it."""
        try:
            try:
                outcome = done.value()
                events = None
                if profiled:
                    outcome, events = outcome
            except BaseException as exc:  # the request failed: no events travel
                self._finish_failed(src, msg_id, remote_ids, _failure_of(self.info, exc), None)
                return
            if isinstance(outcome, _UdfRaised):  # the Python function raised: its events travel too
                self._finish_failed(src, msg_id, remote_ids, outcome.failure, events)
                return
            if remote_ids is not None:
                self.rrefs.created(tuple(remote_ids[0])).value.set_result(outcome)
                self._respond(src, msg_id, K_REMOTE_RET, None, events)
            else:
                self._respond(src, msg_id, K_PYTHON_RET, outcome, events)
        finally:
            next(self._finished)

    def _finish_failed(self, src: int, msg_id: int, remote_ids, failure, events) -> None:
        if remote_ids is not None:  # remote(): the owner keeps the error for every fetch
            self.rrefs.created(tuple(remote_ids[0])).value.set_exception(_Failure(failure))
        self._respond_error(src, msg_id, failure, events)

    def _serve_fetch(self, src: int, msg_id: int, frame: Frame) -> None:
        try:
            rref_id = tuple(serialize.loads(frame.header, frame.tensors))
            with self.rrefs.lock:
                entry = self.rrefs._entry(rref_id)
        except Exception as exc:
            self._respond_error(src, msg_id, remote_exception(self.info, exc))
            next(self._finished)
            return

        def answer(done):
            try:
                try:
                    value = done.value()
                except BaseException as exc:
                    self._respond_error(src, msg_id, _failure_of(self.info, exc))
                    return
                self._respond(src, msg_id, K_FETCH_RET, value, None)
            finally:
                next(self._finished)

        entry.value.add_done_callback(answer)

    def _respond(self, dst: int, msg_id: int, kind: int, value, events) -> None:
        context_id = self._autograd_requests.pop((dst, msg_id), None) if self._autograd_requests else None
        try:
            if context_id is None:
                header, tensors = serialize.dumps((value, events))
            else:  # the request came inside a context: a response carrying grad gets a send function
                kind, header, tensors = autograd.wrap_response(self, dst, context_id, kind, (value, events))
        except Exception as exc:
            self._respond_error(dst, msg_id, remote_exception(self.info, exc))
            return
        self._answer(dst, Frame(kind, msg_id, header, tensors))

    def _respond_error(self, dst: int, msg_id: int, failure, events=None) -> None:
        """An exception response; ``events``: a profiled Python function's events (see _UdfRaised)."""
        exc_type, text = failure
        if self._autograd_requests:
            self._autograd_requests.pop((dst, msg_id), None)
        try:
            header, tensors = serialize.dumps((exc_type, text, events))
        except Exception:  # a local exception class cannot travel by name
            header, tensors = serialize.dumps((RuntimeError, text, events))
        self._answer(dst, Frame(K_EXCEPTION, msg_id, header, tensors))

    def _answer(self, dst: int, frame: Frame) -> None:
        if dst == self.rank:
            self._response(Frame(frame.kind, frame.msg_id, frame.header, serialize.self_copy(frame.tensors)))
            return
        try:
            self.transport.send(dst, frame)
        except Exception as exc:
            log.warning("%s: response to rank %s not sent: %s", self.info, dst, exc)

    # ========================================================== responses
    def _response(self, frame: Frame) -> None:
        entry = self._pending.pop(frame.msg_id, None)
        if entry is None:
            return  # its call timed out (or was failed): a late answer is dropped
        events = None
        try:
            if frame.kind == K_FORWARD_RESP:  # recorded in its context: the recv function first
                frame = autograd.unwrap_response(self, entry.dst, frame)
            if frame.kind == K_EXCEPTION:
                exc_type, text, events = serialize.loads(frame.header, frame.tensors)
                outcome = raise_remote(exc_type, text)
            else:
                value, events = serialize.loads(frame.header, frame.tensors)
                outcome = None
        except BaseException as exc:
            outcome = RuntimeError(f"RPC response from {self.workers[entry.dst]} could not be decoded: "
                                   f"{type(exc).__name__}: {exc}")
        if entry.call is not None:
            profiling.absorb_response(entry.call, events)
        if outcome is not None:
            if entry.rref is not None and entry.rref._error is None:  # remote() failed: to_here raises it
                entry.rref._error = outcome
            entry.future.set_exception(outcome)
        elif frame.kind == K_REMOTE_RET:
            entry.rref._confirmed = True
            entry.future.set_result(True)
        else:
            entry.future.set_result(value)


class _Failure(Exception):
    """A UDF failure carried through a Future as (type, text), formatted once."""

    def __init__(self, failure):
        super().__init__(failure[1])
        self.failure = failure


class _UdfRaised:
    """A Python function's exception as the request's value (torch's RemoteException): (type, text)."""

    __slots__ = ("failure",)

    def __init__(self, failure):
        self.failure = failure


def _is_python_udf(func) -> bool:
    """Not a torch builtin, not TorchScript: a function torch would run through internal._run_function."""
    return not isinstance(func, torch.jit.ScriptFunction) and torch.jit._builtins._find_builtin(func) is None


def _failure_of(info, exc: BaseException):
    if isinstance(exc, _Failure):
        return exc.failure
    try:
        raise exc
    except BaseException as caught:
        return remote_exception(info, caught)
