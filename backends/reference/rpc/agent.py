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

RRef bookkeeping (rref.py explains the rule) is the owner table
(owners.py); its messages are handled in delivery order, before any later
frame of the peer.

What travels around a call (distributed autograd's context, profiling's
request and events) is the business of envelope layers (envelope.py,
layers.py): the agent asks each to wrap and unwrap requests and responses
and names none of them.

Graceful shutdown is a termination detection over the store: every worker,
once locally idle, publishes its ledger (ledger.py: messages sent on and
received from each link, and the links it lost); two consecutive rounds with
equal counts, balanced on every link neither end lost, mean nothing is in
flight.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import pickle
import queue
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from functools import partial

import torch
from torch._C._distributed_rpc import WorkerInfo

from . import builtin_ops, device_maps, layers, ledger, serialize
from .envelope import Envelope, OutgoingRequest
from .failures import Failure as _Failure
from .failures import UdfRaised as _UdfRaised
from .failures import failure_of as _failure_of
from .failures import raise_remote, remote_exception
from .owners import OwnerTable
from .rref import RRef
from .transport import Frame, Kind

log = logging.getLogger(__name__)

K_SCRIPT_CALL, K_PYTHON_CALL = int(Kind.SCRIPT_CALL), int(Kind.PYTHON_CALL)
K_SCRIPT_REMOTE, K_PYTHON_REMOTE = int(Kind.SCRIPT_REMOTE_CALL), int(Kind.PYTHON_REMOTE_CALL)
K_FETCH = int(Kind.PYTHON_RREF_FETCH_CALL)
K_PYTHON_RET, K_REMOTE_RET, K_FETCH_RET = int(Kind.PYTHON_RET), int(Kind.REMOTE_RET), int(Kind.PYTHON_RREF_FETCH_RET)
K_EXCEPTION = int(Kind.EXCEPTION)
CALLS = frozenset((K_SCRIPT_CALL, K_PYTHON_CALL))
REMOTES = frozenset((K_SCRIPT_REMOTE, K_PYTHON_REMOTE))
# the agent's own; each envelope layer adds the kinds it frames and serves (see Agent.__init__)
REQUESTS = CALLS | REMOTES | {K_FETCH}
RESPONSES = frozenset(int(k) for k in (Kind.SCRIPT_RET, Kind.PYTHON_RET, Kind.REMOTE_RET, Kind.SCRIPT_RREF_FETCH_RET,
                                       Kind.PYTHON_RREF_FETCH_RET, Kind.RREF_ACK, Kind.EXCEPTION))
NAMES = {int(k): k.name for k in Kind}

WATCHDOG_TICK_S = 0.02
ID_BITS = 40  # message ids below 2**40 share a deadline heap entry with their deadline
ID_MASK = (1 << ID_BITS) - 1
IDLE_POLL_S = 0.002
# shutdown(timeout=0) waits for late workers as long as it takes (7 days: within int32 ms)
UNBOUNDED_SHUTDOWN_WAIT = timedelta(days=7)
# how long past its deadline a store call is still waited for: a store that answers, if only with its own timeout
# error (a worker's key missing), is heard, and only one that gives no answer at all is reported as silent
STORE_GRACE_S = 0.5


def _within(deadline: float, why: str, call):
    """``call()`` on a thread of its own, given up STORE_GRACE_S after ``deadline`` (time.monotonic()) with
    RuntimeError(``why``).

    For the store's calls: torch's TCPStore client bounds a wait by its timeout only while its server answers; a
    request dropped on the way (the store cut off from this host) is never answered and never given up
    (backends/spec.py TCPSTORE_GET_UNBOUNDED). The thread is left behind on the dead connection."""
    result: list = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=run, name="reference-rpc-store-call", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline + STORE_GRACE_S - time.monotonic()))
    if failure:
        raise failure[0]
    if not result:
        raise RuntimeError(why)
    return result[0]
# the least a graceful shutdown with a timeout leaves its transport's close (the STOP exchange with idle peers takes
# milliseconds): a shutdown that used up its timeout still ends within it plus this
CLOSE_GRACE_S = 0.5

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
    """A call waiting for its response; ``state``: the envelope layers' caller-side state (None: none kept)."""

    __slots__ = ("future", "state", "dst", "timeout", "rref")

    def __init__(self, future, state, dst, timeout, rref=None):
        self.future, self.state, self.dst, self.timeout, self.rref = future, state, dst, timeout, rref


class Agent:
    def __init__(self, name: str, rank: int, world_size: int, options, store, transport,
                 envelopes: Sequence[Envelope] | None = None):
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
        # counters read through repr(): next() is atomic, += is not
        self._finished = itertools.count()
        # graceful shutdown's ledger, per link: requests and RRef messages sent to each rank (minus the
        # sends that raised) and received from each (their sum, against _finished, says the agent is
        # idle); a lost link's messages are lost for good (their calls failed), so its counts leave the
        # ledger rather than keep shutdown waiting for ever
        self._sent_to = [itertools.count() for _ in range(world_size)]
        self._failed_to = [itertools.count() for _ in range(world_size)]
        self._received_from = [itertools.count() for _ in range(world_size)]
        self._lost: set[int] = set()
        self._backlog: queue.SimpleQueue = queue.SimpleQueue()
        self._slots: queue.SimpleQueue = queue.SimpleQueue()
        for slot in range(options.num_worker_threads):
            self._slots.put(slot)
        self._inline = bool(getattr(transport, "runs_inline", False))
        # the envelope layers, in wrapping order, and the kinds each frames or serves
        self._layers: tuple[Envelope, ...] = tuple(layers.standard() if envelopes is None else envelopes)
        self._request_frames = {kind: layer for layer in self._layers for kind in layer.request_kinds}
        self._response_frames = {kind: layer for layer in self._layers for kind in layer.response_kinds}
        self._served = {kind: layer for layer in self._layers for kind in layer.served_kinds}
        self._requests = REQUESTS | frozenset(self._request_frames) | frozenset(self._served)
        self._responses = RESPONSES | frozenset(self._response_frames)
        # (caller rank, msg id) -> (layer, its state) of a request a layer unwrapped: the
        # request is handled in the layer's scope and its response wrapped by the layer
        self._wrapped: dict[tuple, tuple] = {}
        self._threads: list[threading.Thread] = []
        # (caller rank, msg id) -> Future of the owners' confirmations of the user RRefs that
        # request carries (owners.py confirm); the request runs once they all came
        self._confirming: dict[tuple, torch.futures.Future] = {}
        # by rank: where the tensors of a request to it land (this worker's map for it) and those of a response
        # to it (the inverse of its map to this worker); set at start from every worker's options (device_maps.py),
        # None until then: CPU tensors only
        self._request_places: list = [None] * world_size
        self._response_places: list = [None] * world_size

    # ================================================================ life
    def start(self) -> None:
        store, rank = self.store, self.rank
        # devices and maps first: a worker whose name is published has published them (one wait, not two)
        mine = device_maps.advertise(self.name, self.options.device_maps, self.options.devices)
        store.set(f"agent/devices/{rank}", mine.encode())
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
        self._check_device_maps()
        for i in range(self.options.num_worker_threads):
            self._spawn(self._pool_loop, f"rpc-worker-{i}")
        self._spawn(self._watchdog, "rpc-watchdog")
        self.transport.start(rank, self.world_size, store, self._deliver, self._peer_lost)

    def _check_device_maps(self) -> None:
        """Every worker's maps, devices and accelerator, published in start(); each checks the whole world's
        (device_maps.check_world: every worker raises the same ValueError) and keeps the inverse of each
        peer's map to it, for its replies (TensorPipe's reverse device maps)."""
        store, options = self.store, self.options
        world = [device_maps.Advertised.decode(store.get(f"agent/devices/{r}")) for r in range(self.world_size)]
        device_maps.check_world(world)
        reverse = device_maps.reverse_maps(self.name, world)
        self._request_places = [device_maps.placement(options.device_maps.get(info.name), info.name, "request")
                                for info in self.workers]
        self._response_places = [device_maps.placement(reverse.get(info.name), info.name, "response")
                                 for info in self.workers]

    def _get_device_map(self, dst: WorkerInfo) -> dict:
        """This worker's map for ``dst`` (TensorPipeAgent::getDeviceMap): {} when it has none."""
        return dict(self.options.device_maps.get(dst.name, {}))

    def _placing(self, dst: int, request: bool):
        """The scope in which a message to rank ``dst`` is pickled: where its tensors land (device_maps.py)."""
        return serialize.placing((self._request_places if request else self._response_places)[dst])

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=f"{name}-r{self.rank}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def shutdown(self, graceful: bool = True, timeout: float = 0) -> None:
        deadline = time.monotonic() + timeout if graceful and timeout and timeout > 0 else None
        try:
            if graceful:
                self._wait_all_workers(timeout)
        finally:
            # the timeout bounds the whole shutdown, the transport's close too (at least CLOSE_GRACE_S)
            self._stop(None if deadline is None else max(deadline - time.monotonic(), CLOSE_GRACE_S))

    def _stop(self, within_s: float | None = None) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._wake_watchdog.set()
        try:
            self.transport.shutdown(within_s)
        finally:
            for _ in range(self.options.num_worker_threads):
                self._backlog.put(None)
            error = RuntimeError(f"RPC agent {self.info} was shut down before the call completed")
            for msg_id in list(self._pending):
                entry = self._pending.pop(msg_id, None)
                if entry is not None:
                    self._fail(entry, error)
            self.rrefs.clear()

    @staticmethod
    def _count(counter) -> int:
        return int(repr(counter)[6:-1])

    def _idle(self) -> bool:
        return not self._pending and self._received() == self._count(self._finished) \
            and self._backlog.empty()

    def _received(self) -> int:
        return sum(self._count(r) for r in self._received_from)

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
            # every round, not only while busy: idle workers whose ledgers never balance (a message lost to a
            # silent partition) would otherwise go round in lockstep for ever
            if deadline is not None and round_ and time.monotonic() > deadline:
                raise RuntimeError(f"{self.info}: RPC shutdown timed out after {timeout:g} s: the workers' "
                                   f"message counts never balanced (messages to or from {self._unbalanced(previous)} "
                                   "still in flight)")
            keys = [f"shutdown/{round_}/{r}" for r in range(self.world_size)]
            if deadline is not None:
                found = _within(deadline, f"{self.info}: RPC shutdown timed out after {timeout:g} s: the store gave "
                                "no answer", lambda: self._exchange_ledgers(round_, keys, deadline))
            else:  # torch's graceful shutdown has no timeout: never the store's (the RPC timeout)
                found = self._exchange_ledgers(round_, keys, None)
            links = ledger.open_links([ledger.Ledger.decode(value, self.world_size) for value in found])
            if ledger.quiet(links) and links == previous:  # and nothing moved since the last round
                return
            previous = links

    def _exchange_ledgers(self, round_: int, keys: list[str], deadline: float | None) -> list[bytes]:
        """Publish this worker's ledger for ``round_`` and read every worker's, over the store."""
        self.store.set(f"shutdown/{round_}/{self.rank}", self._ledger())
        wait = timedelta(seconds=max(0.001, deadline - time.monotonic())) if deadline is not None \
            else UNBOUNDED_SHUTDOWN_WAIT
        self.store.wait(keys, wait)
        return [self.store.get(key) for key in keys]

    def _unbalanced(self, links) -> str:
        """The workers of the links whose counts differ (sent against received), in words, for shutdown's error."""
        ranks = sorted({rank for (src, dst), (sent, received) in (links or {}).items() if sent != received
                        for rank in (src, dst)})
        return ", ".join(str(self.workers[r]) for r in ranks if r < len(self.workers)) or "some worker"

    def _ledger(self) -> bytes:
        sent = tuple(self._count(s) - self._count(f) for s, f in zip(self._sent_to, self._failed_to))
        return ledger.Ledger(sent, tuple(self._count(r) for r in self._received_from), frozenset(self._lost)).encode()

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
        remote_ids = (rref.rref_id, rref.fork_id) if rref is not None else None
        request = OutgoingRequest(dst, kind, key, (key, target, args, kwargs, async_exec, remote_ids), call)
        kind, header, tensors = self._wrap_request(request)
        future = SyncWaiter() if sync else torch.futures.Future()
        msg_id = next(self._ids)
        self._pending[msg_id] = Pending(future, request.state, dst, timeout, rref)
        if timeout > 0:
            self._arm(time.monotonic() + timeout, msg_id)
        self._send(dst, Frame(kind, msg_id, header, tensors), msg_id)
        return future

    def _wrap_request(self, request: OutgoingRequest) -> tuple:
        """(kind, header, tensors) of a request, once every layer wrapped it."""
        with self._placing(request.dst, request=True):
            for layer in self._layers:
                layer.wrap_request(self, request)
            if request.framed is not None:
                return request.framed
            header, tensors = serialize.dumps(request.payload())
        return (request.kind, header, tensors)

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
        error = rref._creation_error()
        if error is not None:
            raise error
        if timeout < 0:
            timeout = self.default_timeout
        owner = rref._owner_rank()
        request = OutgoingRequest(owner, K_FETCH, None, rref.rref_id, carries_fields=False)
        kind, header, tensors = self._wrap_request(request)
        future = torch.futures.Future()
        msg_id = next(self._ids)
        self._pending[msg_id] = Pending(future, request.state, owner, timeout)
        if timeout > 0:
            self._arm(time.monotonic() + timeout, msg_id)
        frame = Frame(kind, msg_id, header, tensors)
        creation = rref._creation_pending()
        if creation is None:
            self._send(owner, frame, msg_id)
            return future

        def created(_):
            error = rref._creation_error()
            if error is not None:
                entry = self._pending.pop(msg_id, None)
                if entry is not None:
                    entry.future.set_exception(error)
                return
            if msg_id in self._pending:
                with self._detached():  # may run inside the caller's callbacks (a profiled one, say)
                    self._send(owner, frame, msg_id)

        creation.add_done_callback(created)
        return future

    def _detached(self):
        """Every layer's scope for work done later, from a callback, on behalf of an earlier call."""
        stack = contextlib.ExitStack()
        for layer in self._layers:
            stack.enter_context(layer.detached())
        return stack

    def request(self, dst: int, kind: int, header: bytes, tensors: list, timeout: float = -1.0):
        """A request whose header is already encoded (a layer's own requests); a Future of its response value."""
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
        next(self._sent_to[dst])
        if dst == self.rank:  # self: skip the transport, still through the pool, tensors copied
            next(self._received_from[dst])
            local = Frame(frame.kind, frame.msg_id, frame.header, serialize.self_copy(frame.tensors))
            if local.kind in self._requests:
                self._accept_request(dst, local, inline=False)
            else:
                self._control(dst, local)
            return
        try:
            self.transport.send(dst, frame)
        except Exception as exc:
            next(self._failed_to[dst])
            if msg_id is None:  # no call of ours waits on it (a response, a control frame): the caller handles it
                raise
            entry = self._pending.pop(msg_id, None)
            if entry is not None:
                self._fail(entry, RuntimeError(f"RPC to {self.workers[dst]} failed: {exc}"))
            # else the call's future has its error already (the transport failed the peer's calls as it gave up on
            # it, or the call timed out): like TensorPipe's, a call to a lost peer never raises where it was made

    def _fail(self, entry: Pending, error: BaseException) -> None:
        if entry.state is not None:
            self._unwrap_response(entry.state, None)
        if entry.rref is not None:
            entry.rref._creation_failed(error)
        entry.future.set_exception(error)

    def _unwrap_response(self, state: dict, fields) -> None:
        """The call ended: each layer that kept state sees its reply fields (None: none came)."""
        for layer in self._layers:
            if layer.name in state:
                mine = fields.get(layer.name) if isinstance(fields, dict) else None
                layer.unwrap_response(self, state[layer.name], mine)

    def _peer_lost(self, peer: int, reason: str) -> None:
        self._lost.add(peer)
        name = self.workers[peer] if peer < len(self.workers) else peer
        for msg_id, entry in list(self._pending.items()):
            if entry.dst == peer:
                taken = self._pending.pop(msg_id, None)
                if taken is not None:
                    self._fail(taken, RuntimeError(f"RPC to {name} failed: {reason}"))

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
        if kind in self._responses:
            self._response(frame)
            return
        next(self._received_from[src])
        if kind in self._requests:
            self._accept_request(src, frame, self._inline)
        else:
            self._control(src, frame)

    def _control(self, src: int, frame: Frame) -> None:
        kind = frame.kind
        if kind in self._responses:  # a self-call's response
            self._response(frame)
            return
        try:
            rref_id, fork_id = serialize.loads(frame.header, frame.tensors)
            if not self.rrefs.handle(kind, tuple(rref_id), tuple(fork_id)):
                log.warning("%s: unexpected message kind %s from rank %s ignored", self.info, kind, src)
        except Exception:
            log.exception("%s: bad RRef message from rank %s", self.info, src)
        finally:
            next(self._finished)

    def _accept_request(self, src: int, frame: Frame, inline: bool) -> None:
        layer = self._request_frames.get(frame.kind)
        if layer is not None:
            # unwrapped in delivery order (autograd: the recv function exists before anything runs)
            try:
                frame, state = layer.unwrap_request(self, src, frame)
            except Exception as exc:
                self._refuse(src, frame, exc)
                return
            self._wrapped[(src, frame.msg_id)] = (layer, state)
        if frame.kind in REMOTES:
            # decoded here, in delivery order: the caller's fork must be registered
            # before any later delete from that caller (rref.py)
            job = (src, frame, self._decode(src, frame))
            if not isinstance(job[2], BaseException) and job[2][5] is not None:
                rref_id, fork_id = job[2][5]
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

    def _decode(self, src: int, frame: Frame):
        """The request's payload; user RRefs forked to us by another user start their owners' confirmation."""
        try:
            with self.rrefs.decoding() as forks:
                decoded = serialize.loads(frame.header, frame.tensors)
            if forks:  # _handle_call runs the request once every owner confirmed (torch's pending RRefs)
                self._confirming[(src, frame.msg_id)] = self.rrefs.confirm(forks)
            return decoded
        except AttributeError as exc:  # torch's internal.deserialize() addition
            error = AttributeError(str(exc) + UDF_NOT_FOUND)
            error.__cause__ = exc
            return error
        except BaseException as exc:
            return exc

    def _refuse(self, src: int, frame: Frame, exc: BaseException) -> None:
        """A malformed request: answer it with the reason (naming the sender), log it, keep serving."""
        what = NAMES.get(frame.kind, f"kind {frame.kind}")
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
        layer = self._served.get(frame.kind)
        if layer is not None:
            self._serve(layer, src, frame)
            return
        wrapped = self._wrapped.get((src, frame.msg_id)) if self._wrapped else None
        if wrapped is None:
            self._handle_call(src, frame, decoded)
            return
        layer, state = wrapped
        with layer.scope(state):  # autograd: nested RPCs of this request carry its context
            self._handle_call(src, frame, decoded)

    def _serve(self, layer: Envelope, src: int, frame: Frame) -> None:
        """A layer's own request (autograd's propagate-gradients, say): answered when its work is done."""
        msg_id = frame.msg_id
        try:
            fut = layer.serve(self, src, frame)
        except Exception as exc:
            self._refuse(src, frame, exc)
            return

        def answer(done):
            try:
                self._respond(src, msg_id, K_PYTHON_RET, done.value(), None)
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
                decoded = self._decode(src, frame)
            confirming = self._confirming.pop((src, msg_id), None) if self._confirming else None
            if confirming is not None:
                for confirmation in confirming.wait():
                    confirmation.wait()  # a fork the owner cannot confirm fails the request
            if isinstance(decoded, BaseException):
                try:
                    raise decoded
                except BaseException as exc:
                    failure = remote_exception(self.info, exc)
                self._respond_error(src, msg_id, failure)
                return
            key, target, args, kwargs, async_exec, remote_ids, fields = decoded
            if fields is None and not async_exec and remote_ids is None:
                # the hot path: run, answer
                try:
                    value = (_RESOLVED.get(key) or resolve_key(key) if key is not None
                             else resolve_target(target))(*args, **kwargs)
                except Exception as exc:
                    self._respond_error(src, msg_id, remote_exception(self.info, exc))
                    return
                self._respond(src, msg_id, K_PYTHON_RET, value, None)
                return
            run = partial(self._run_to_future, key, target, args, kwargs, async_exec)
            reply: dict | None = None
            if fields is None:
                fut = run()
            else:
                reply = {}
                fut = self._run_in_layers(fields, run, reply)
            chained = True
            fut.add_done_callback(lambda done: self._finish(src, msg_id, remote_ids, reply, done))
        except Exception as bug:  # a bug here must still answer the caller
            if not chained:
                self._respond_error(src, msg_id, remote_exception(self.info, bug))
            else:
                log.exception("%s: request %s failed after chaining", self.info, msg_id)
        finally:
            if not chained:
                next(self._finished)

    def _run_in_layers(self, fields: dict, run, reply: dict) -> torch.futures.Future:
        """Run a request inside every layer whose fields it carries (the last such layer outermost)."""
        for layer in self._layers:
            mine = fields.get(layer.name)
            if mine is not None:
                run = partial(layer.run, self, mine, run, reply)
        return run()

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

    def _finish(self, src: int, msg_id: int, remote_ids, reply: dict | None, done) -> None:
        """A chained (async_execution, remote, or run in layers) request completed: answer it.

        ``reply``: the layers' reply fields (profiling's events), filled before ``done`` completed.
        """
        try:
            try:
                outcome = done.value()
            except BaseException as exc:  # the request failed: no reply fields travel
                self._finish_failed(src, msg_id, remote_ids, _failure_of(self.info, exc), None)
                return
            fields = reply or None
            if isinstance(outcome, _UdfRaised):  # the Python function raised: its reply fields travel too
                self._finish_failed(src, msg_id, remote_ids, outcome.failure, fields)
                return
            if remote_ids is not None:
                self.rrefs.created(tuple(remote_ids[0])).value.set_result(outcome)
                self._respond(src, msg_id, K_REMOTE_RET, None, fields)
            else:
                self._respond(src, msg_id, K_PYTHON_RET, outcome, fields)
        finally:
            next(self._finished)

    def _finish_failed(self, src: int, msg_id: int, remote_ids, failure, fields) -> None:
        if remote_ids is not None:  # remote(): the owner keeps the error for every fetch
            self.rrefs.created(tuple(remote_ids[0])).value.set_exception(_Failure(failure))
        self._respond_error(src, msg_id, failure, fields)

    def _serve_fetch(self, src: int, msg_id: int, frame: Frame) -> None:
        try:
            rref_id = tuple(serialize.loads(frame.header, frame.tensors))
            entry = self.rrefs.entry(rref_id)
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

    def _respond(self, dst: int, msg_id: int, kind: int, value, fields) -> None:
        """A response; ``fields``: the layers' reply fields (None: none)."""
        wrapped = self._wrapped.pop((dst, msg_id), None) if self._wrapped else None
        try:
            framed = None
            with self._placing(dst, request=False):
                if wrapped is not None:  # a layer unwrapped the request: it may frame the response
                    layer, state = wrapped
                    framed = layer.wrap_response(self, dst, state, kind, (value, fields))
                if framed is None:
                    header, tensors = serialize.dumps((value, fields))
            if framed is not None:
                kind, header, tensors = framed
        except Exception as exc:
            self._respond_error(dst, msg_id, remote_exception(self.info, exc))
            return
        self._answer(dst, Frame(kind, msg_id, header, tensors))

    def _respond_error(self, dst: int, msg_id: int, failure, fields=None) -> None:
        """An exception response; ``fields``: reply fields of a Python function that raised (see _UdfRaised)."""
        exc_type, text = failure
        if self._wrapped:
            self._wrapped.pop((dst, msg_id), None)
        try:
            header, tensors = serialize.dumps((exc_type, text, fields))
        except Exception:  # a local exception class cannot travel by name
            header, tensors = serialize.dumps((RuntimeError, text, fields))
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
        fields = None
        try:
            layer = self._response_frames.get(frame.kind)
            if layer is not None:  # autograd: recorded in its context, the recv function first
                frame = layer.unframe_response(self, entry.dst, frame)
            if frame.kind == K_EXCEPTION:
                exc_type, text, fields = serialize.loads(frame.header, frame.tensors)
                outcome = raise_remote(exc_type, text)
            else:
                value, fields = serialize.loads(frame.header, frame.tensors)
                outcome = None
        except BaseException as exc:
            outcome = RuntimeError(f"RPC response from {self.workers[entry.dst]} could not be decoded: "
                                   f"{type(exc).__name__}: {exc}")
        if entry.state is not None:
            self._unwrap_response(entry.state, fields)
        if outcome is not None:
            if entry.rref is not None:  # remote() failed: to_here raises it
                entry.rref._creation_failed(outcome)
            entry.future.set_exception(outcome)
        elif frame.kind == K_REMOTE_RET:
            entry.rref._confirm()
            entry.future.set_result(True)
        else:
            entry.future.set_result(value)


def _is_python_udf(func) -> bool:
    """Not a torch builtin, not TorchScript: a function torch would run through internal._run_function."""
    return (not isinstance(func, torch.jit.ScriptFunction) and not builtin_ops.is_operator(func)
            and torch.jit._builtins._find_builtin(func) is None)
