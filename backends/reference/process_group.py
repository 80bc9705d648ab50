"""ReferenceProcessGroup: every c10d collective and p2p operation, in plain Python.

How every collective runs (one numbered step-0 round, sometimes a second):

1. The caller's thread numbers the collective (``seq``: the same on every
   rank because c10d requires ranks to issue collectives in the same order)
   and queues it; one worker thread per group runs them in that order, so
   ``async_op=True`` simply returns the queued Work.
2. Step 0: every rank sends every other rank one frame carrying its
   *fingerprint* (operation, reduce op, dtype, shape, root, split sizes) and
   whatever data that peer needs from it. Every rank then holds every
   fingerprint, so a disagreement raises the same error, naming the ranks and
   the difference, on every rank (what TORCH_DISTRIBUTED_DEBUG=DETAIL checks,
   always on), instead of a hang or garbage.
3. The result is computed with backends/reference/semantics.py, the same
   functions the suites use as the oracle, and copied into the caller's
   tensors (which may be strided views).

A rank that never arrives makes the others raise after the group's (or the
call's) timeout, naming the operation and the missing ranks.

A group connects when it is made; with ``DISTCONFORM_REFERENCE_LAZY_INIT=1``
in the environment when it is made (its lazy connection switch, as gloo's
``TORCH_GLOO_LAZY_INIT``), each pair of ranks connects when an operation first
needs it, within that operation's timeout.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import os
import queue
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from . import backend_form, fault_tolerance, semantics, wire
from .flight_recorder import Entry, recorder
from .transport import Mesh, PeerError, RecvTimeout, SendTimeout

SMALL_ALL_REDUCE_BYTES = 64 * 1024  # below: one round (all-gather, reduce locally); above: two
LAZY_INIT_ENV = "DISTCONFORM_REFERENCE_LAZY_INIT"  # "1" when a group is made: it connects at its first operation


# C++ callers (DDP's reducer keeps the Join all_reduce's Work to wait() and
# result() on it a whole backward pass later) hold only the C++ half of a
# Python Work. Once Python drops its last reference the overrides below are
# gone and C++ falls through to c10d's base Work (wait() never returns,
# getFuture() "not implemented"). So the group keeps every Work alive while
# it is in flight and the most recent completed ones after that: the last
# RECENT_WORKS, fewer while those hold more than RECENT_BYTES of results (a
# completed Work keeps its output tensors; 4096 all_reduces of 48 MiB held a
# rank's 5.4 GB when the kernel killed it), never fewer than RECENT_WORKS_KEPT.
_WORKS_IN_FLIGHT: set = set()
RECENT_WORKS, RECENT_WORKS_KEPT, RECENT_BYTES = 4096, 64, 256 << 20
_WORKS_RECENT: collections.deque = collections.deque()  # (work, bytes its result holds)
_recent = {"bytes": 0}
_recent_lock = threading.Lock()


def _result_bytes(value) -> int:
    tensors = value if isinstance(value, (list, tuple)) else [value]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _keep_recent(work, held: int) -> None:
    with _recent_lock:
        _WORKS_RECENT.append((work, held))
        _recent["bytes"] += held
        while len(_WORKS_RECENT) > RECENT_WORKS or (
                len(_WORKS_RECENT) > RECENT_WORKS_KEPT and _recent["bytes"] > RECENT_BYTES):
            _recent["bytes"] -= _WORKS_RECENT.popleft()[1]


class ReferenceWork(dist.Work):
    """A Work backed by a torch Future, with the group's timeout on wait()."""

    def __init__(self, what: str, timeout_s: float, on_timeout=None):
        super().__init__()
        self.future = torch.futures.Future()
        self.what, self.timeout_s, self.on_timeout = what, timeout_s, on_timeout
        self.source = -1
        # perf_counter() when the worker began and finished it
        self.started: float | None = None
        self.ended: float | None = None
        self.fr_entry: Entry | None = None  # its flight-recorder entry (flight_recorder.py), if recorded
        self._done = threading.Event()
        _WORKS_IN_FLIGHT.add(self)

    def complete(self, value) -> None:
        self._record_completion()
        self.future.set_result(value)
        self._finished(_result_bytes(value))

    def fail(self, error: Exception) -> None:
        self._record_failure()
        self.future.set_exception(error)
        self._finished(0)

    def _record_completion(self) -> None:
        """Mark the recorder's entry completed before any waiter wakes: read after wait(), it says so."""
        if self.fr_entry is not None:
            recorder().completed(self.fr_entry)

    def _record_failure(self) -> None:
        """Retire the recorder's entry without marking it completed: a collective that failed never completed."""
        if self.fr_entry is not None:
            recorder().failed(self.fr_entry)

    def _finished(self, held: int) -> None:
        self.ended = time.perf_counter()
        self._done.set()
        _keep_recent(self, held)
        _WORKS_IN_FLIGHT.discard(self)

    def wait(self, timeout=None):
        limit = self.timeout_s if timeout is None or timeout.total_seconds() <= 0 else timeout.total_seconds()
        if not self._done.wait(limit):
            if self.on_timeout is None or self.on_timeout():
                # c10d's wording ("Timed out ..."), so the patterns users match real backends' errors
                # against match this one too
                raise RuntimeError(f"reference: Timed out waiting {limit * 1000:.0f}ms for {self.what} "
                                   f"to complete")
            self._done.wait()  # the result arrived while we gave up: use it
        self.future.wait()  # raises the operation's error, if any
        return True

    def is_completed(self):
        return self.future.done()

    def is_success(self):
        return self.future.done() and self.exception() is None

    def exception(self):
        if not self.future.done():
            return None
        try:
            self.future.wait()
            return None
        except Exception as exc:
            return exc

    def result(self):
        self.wait()
        return self.future.value()

    def synchronize(self):
        self.wait()

    def get_future(self):
        return self.future

    def _get_duration(self) -> float:
        """Milliseconds the operation ran (c10d's collectives timing), from its start to its completion."""
        if not self._done.is_set():
            raise RuntimeError(f"reference: {self.what} has not completed; it has no duration yet")
        ended = self.ended
        assert ended is not None  # _finished() sets it before it sets _done
        return (ended - (self.started if self.started is not None else ended)) * 1000.0

    def _source_rank(self):
        return self.source

    def source_rank(self):
        return self.source


@dataclasses.dataclass(frozen=True)
class CompletedWork:
    """What a completion hook is told about a finished Work: c10d's WorkInfo fields (op_type as a name;
    a Python group cannot build the C++ WorkInfo)."""

    op_type: str
    seq: int
    time_started: float  # perf_counter() seconds
    time_finished: float
    active_duration: timedelta


class CollectiveMismatch(RuntimeError):
    pass


def _seconds(opts_timeout, default: timedelta) -> float:
    seconds = opts_timeout.total_seconds() if opts_timeout is not None else -1
    return seconds if seconds > 0 else default.total_seconds()


_LIVE_GROUPS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_threads_before_exit() -> None:
    """Shut every live group down and let its threads end before the interpreter finalizes.

    A daemon thread still inside torch's C++ code when finalization starts (finishing a
    future whose wait() already returned, dropping the last reference to a Work: both
    release the GIL and take it back) is killed with std::terminate, and the process
    aborts with "terminate called without an active exception" after a clean run.
    """
    for pg in list(_LIVE_GROUPS):
        pg.shutdown()
    deadline = time.monotonic() + 2.0
    for thread in threading.enumerate():
        if thread.name.startswith(("reference-worker", "reference-read", "reference-write")):
            thread.join(max(0.0, deadline - time.monotonic()))


class ReferenceProcessGroup(dist.ProcessGroup):
    """A c10d process group over its own TCP mesh; see the module docstring."""

    work_class = ReferenceWork  # what collectives return (a subclass may plant a bug in it)

    def __init__(self, store, rank: int, size: int, timeout: timedelta, global_ranks=None, host=None,
                 enable_reconfigure: bool = False):
        super().__init__(rank, size)
        # rank() and size() answer these: a reconfigure renumbers the group (c10d's own fields stay as made)
        self._rank, self._size = rank, size
        self.timeout = timeout
        self.enable_reconfigure = enable_reconfigure
        self._host = host
        # torch 2.14's fault tolerance (fault_tolerance.py): this rank's handle, the uuids its reconfigures used,
        # the group's error and abort hooks, its pre/post hooks
        self._handle = fault_tolerance.new_handle()
        self._used_uuids: set[int] = set()
        self._faults = fault_tolerance.FaultState()
        self._op_hooks = fault_tolerance.OpHooks()
        self.global_ranks = list(global_ranks) if global_ranks else list(range(size))
        # Kept for the group's life, as ProcessGroupGloo keeps its store: a caller that keeps only the group
        # (torch.distributed._dist2.new_group) drops its own reference on return, and rank 0's store server with
        # it, while slower peers still rendezvous on it ('DistNetworkError: Failed to recv, got 0 bytes' on rank
        # 2 of 3, suites/c10d/test_dist2.py)
        self.store = store
        # with enable_reconfigure the communicator is made by the first reconfigure(), as gloo does
        self._mesh: Mesh | None = None if enable_reconfigure else Mesh(
            store, rank, size, timeout, host=host, lazy=os.environ.get(LAZY_INIT_ENV) == "1")
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._shrinks = 0  # shrink()s of this group so far: the store prefix of the next shrunk group
        self._coalesced: list[ReferenceWork] | None = None  # between _start_coalescing and _end_coalescing
        self._completion_hooks: list = []  # _register_on_completion_hook; called once per finished collective
        self._pending: set[ReferenceWork] = set()  # queued or running collectives (_wait_for_pending_works)
        self._pending_lock = threading.Lock()
        # why the group runs no more collectives (a collective of it timed out); None while it is usable
        self._unusable: str | None = None
        self._fr_group = recorder().group(self.global_ranks)  # how the flight recorder knows this group
        self._start_worker()
        _LIVE_GROUPS.add(self)

    def _start_worker(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work_loop, args=(self._jobs,),
                                        name=f"reference-worker-r{self._rank}", daemon=True)
        self._worker.start()

    @property
    def mesh(self) -> Mesh:
        """The connections of the group's communicator (operations check _check_configured() first)."""
        if self._mesh is None:
            raise RuntimeError("reference: the group has no communicator yet (enable_reconfigure=True)")
        return self._mesh

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    # ----------------------------------------------------------- identity
    def getBackendName(self):
        return "reference"

    def _get_backend_name(self):
        return "reference"

    # A Python ProcessGroup has no registered backend to keep its name on.
    def _set_group_name(self, name):
        self._group_name = name
        recorder().named(self._fr_group, name=name)

    def getGroupName(self):
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc):
        self._group_desc = desc
        recorder().named(self._fr_group, desc=desc)

    def getGroupDesc(self):
        return getattr(self, "_group_desc", "")

    def _get_backend(self, device):
        """This group is its own CPU backend: answer torch's per-device lookup with itself.

        A Python ProcessGroup registers no per-device c10d Backend, so the C++ lookup raises
        'No backend type associated with device type cpu'. Torch 2.14's batch_isend_irecv asks
        every ProcessGroup instance (2.13: only ``type(group) is ProcessGroup``) for
        ``group._get_backend(device).supports_coalescing``; answered with this group, which has
        no such attribute, it takes the per-op path, as on 2.13. Other devices still raise.
        """
        try:
            return super()._get_backend(device)
        except RuntimeError:
            if torch.device(device).type != "cpu":
                raise
            return self

    def get_backend(self, device):
        """torch 2.14's get_backend_impl(group, device) asks this (not _get_backend): the same answer."""
        return self._get_backend(device)

    @property
    def options(self):
        """The options the group runs with, as a c10d Backend reports them (``_timeout`` follows set_timeout):
        what ``group._get_backend(device).options`` answers for a C++ backend."""
        reported = torch._C._distributed_c10d.Backend.Options("reference", self.timeout)
        reported.group_name = self.getGroupName()
        reported.global_ranks_in_group = list(self.global_ranks)
        if hasattr(reported, "enable_reconfigure"):  # torch 2.14's field
            reported.enable_reconfigure = self.enable_reconfigure
        return reported

    # c10d offers these for NCCL only; the reference keeps them in Python
    def _register_on_completion_hook(self, hook) -> None:
        self._completion_hooks.append(hook)

    def _has_hooks(self) -> bool:
        return bool(self._completion_hooks)

    def _wait_for_pending_works(self) -> None:
        """Return once every collective issued on this group so far has finished (successfully or not)."""
        with self._pending_lock:
            pending = list(self._pending)
        for work in pending:
            work._done.wait(work.timeout_s)

    def _completed(self, work: ReferenceWork, seq: int, name: str) -> None:
        """Tell the completion hooks about ``work`` (once), then stop counting it as pending."""
        ended = work.ended if work.ended is not None else time.perf_counter()  # called once the work has ended
        started = work.started if work.started is not None else ended
        info = CompletedWork(name, seq, started, ended, timedelta(seconds=ended - started))
        for hook in self._completion_hooks:
            try:
                hook(info)
            except Exception:  # a hook's error must not kill the group's worker (c10d logs and goes on)
                pass
        with self._pending_lock:
            self._pending.discard(work)

    def __repr__(self):
        return f"<ReferenceProcessGroup rank {self.rank()}/{self.size()} global ranks {self.global_ranks}>"

    # ------------------------------------------------------------ running
    def _fr_record(self, name: str, seq: int, inputs, outputs, timeout_s: float, p2p: bool = False) -> Entry | None:
        """The flight recorder's entry for a call just issued (None when the recorder is off)."""
        return recorder().record(self._fr_group, name, seq, inputs, outputs, timeout_s, p2p)

    def _submit(self, name: str, fingerprint: dict, run, opts=None, inputs=(), outputs=()) -> ReferenceWork:
        """Queue a collective; ``run(seq, deadline)`` does the work in the group's worker thread. ``opts``: the
        caller's options (their timeout, asyncOp); ``inputs`` and ``outputs``: the caller's tensors, for the
        flight recorder's sizes and dtypes and the pre/post hooks."""
        self._check_configured(name)
        return self._op_hooks.issue(name, getattr(opts, "asyncOp", True), fingerprint.get("root", -1), inputs,
                                    outputs, lambda: self._queue(name, fingerprint, run, opts, inputs, outputs))

    def _queue(self, name: str, fingerprint: dict, run, opts, inputs, outputs) -> ReferenceWork:
        opts_timeout = getattr(opts, "timeout", None)
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        timeout_s = _seconds(opts_timeout, self.timeout)
        # the worker enforces the timeout itself; wait() only guards against a wedged worker
        work = self.work_class(f"{name} (collective #{seq})", timeout_s + 60)
        work.fr_entry = self._fr_record(name, seq, inputs, outputs, timeout_s)
        with self._pending_lock:
            self._pending.add(work)
        self._jobs.put((work, seq, dict(fingerprint, op=name), run, timeout_s))
        return self._coalescing(work)

    def _coalescing(self, work: ReferenceWork) -> ReferenceWork:
        """``work``, counted in the coalesced Work if it was issued between _start_coalescing and _end_coalescing
        (collectives and p2p alike: torch 2.14's batch_isend_irecv coalesces a backend's sends and receives)."""
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    # c10d's sequence number: the count of collectives this group has issued. Every rank
    # issues them in the same order, so it is the same on every rank between two calls.
    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def _set_sequence_number_for_group(self) -> None:
        pass  # every rank starts at 0: nothing to agree on

    def _work_loop(self, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            work, seq, fingerprint, run, timeout_s = job
            work.started = time.perf_counter()
            recorder().started(work.fr_entry)
            if self._unusable is not None:  # fail at once, never wait out another timeout
                work.fail(RuntimeError(f"reference: {fingerprint['op']} (collective #{seq}) on rank {self.rank()}: "
                                       f"the group is unusable after {self._unusable}"))
                self._completed(work, seq, fingerprint["op"])
                continue
            try:
                # A backend writes data, never autograd history. Grad mode is per thread and on
                # by default here, so without no_grad() the copy_ of a result into the caller's
                # tensor would be recorded whenever that tensor has acquired history by then:
                # a functional all_reduce's output gets its AllReduceBackward node as soon as the
                # op returns, before the worker writes. The copy_ then rebased it onto a
                # CopyBackwards node, whose gradient for the overwritten value is zero, and the
                # backward all_reduce silently summed zeros for that rank (gloo writes raw memory).
                with torch.no_grad():
                    result = run(seq, fingerprint, time.monotonic() + timeout_s, timeout_s)
            except Exception as exc:
                work.fail(exc)
            else:
                work.complete(result)
            self._completed(work, seq, fingerprint["op"])

    def _round(self, seq: int, fingerprint: dict, deadline: float, timeout_s: float,
               payloads: dict[int, torch.Tensor] | None = None, step: int = 0) -> dict[int, torch.Tensor | None]:
        """Send every peer our fingerprint and its payload; gather theirs; check agreement.

        Returns peer -> the tensor that peer sent us (None if it sent none),
        including ourselves (our payload to ourselves, without a copy).
        """
        me, peers = self.rank(), [p for p in range(self.size()) if p != self.rank()]
        payloads = payloads or {}
        keys = [("coll", seq, step, peer) for peer in peers]
        try:
            self.mesh.connect(peers, deadline)  # at once once connected; a lazy group's first operation connects
            for peer in peers:
                tensor = payloads.get(peer)
                meta = {"seq": seq, "step": step, "fp": fingerprint if step == 0 else None}
                if tensor is not None:
                    meta.update(wire.tensor_meta(tensor))
                    self.mesh.send(peer, wire.COLL, 0, meta, wire.tensor_bytes(tensor), deadline=deadline)
                else:
                    self.mesh.send(peer, wire.COLL, 0, meta, deadline=deadline)
            frames = self.mesh.mailbox.take(keys, deadline, lambda missing: self.mesh.failure_for(
                [key[3] for key in missing]))
        except (RecvTimeout, SendTimeout) as timeout:
            # a send to a peer that reads nothing times out as a receive from it does: the same timeout
            if isinstance(timeout, SendTimeout):
                missing = [timeout.peer]
            else:
                missing = sorted(key[3] for key in timeout.args[0])
            self._faults.revoked("TIMEOUT")  # the abort hooks run before the connections close
            self._close_after_timeout(f"{fingerprint['op']} (collective #{seq}) timed out on rank {me}")
            # dials this rank's listener turned away (a second hello from a connected rank, a wrong token): a peer
            # whose sends then fail while this rank hears nothing is explained by them
            refused = f"; dials refused here: {self.mesh.refused[-3:]}" if self.mesh.refused else ""
            raise RuntimeError(
                f"reference: Timed out waiting {timeout_s * 1000:.0f}ms for {fingerprint['op']} (collective "
                f"#{seq}) on rank {me}: no message from group ranks {missing} (global ranks "
                f"{[self.global_ranks[r] for r in missing]}){refused}") from None
        except PeerError as exc:
            self._faults.revoked("REMOTE_ERROR")
            raise RuntimeError(f"reference: {fingerprint['op']} (collective #{seq}) failed: {exc}") from None
        received: dict[int, torch.Tensor | None] = {me: payloads.get(me)}
        fingerprints: dict[int, Any] = {me: fingerprint}  # as the peers sent them (dict, or None after step 0)
        # Mesh delivers every collective frame as (meta, data); take() is typed for any frame.
        for (_, _, _, peer), (peer_meta, data) in cast("dict[tuple, tuple[dict, Any]]", frames).items():
            fingerprints[peer] = peer_meta.get("fp")
            received[peer] = wire.tensor_from(peer_meta, data) if "dtype" in peer_meta else None
        if step == 0:
            self._check_agreement(seq, fingerprints)
        return received

    def _close_after_timeout(self, why: str) -> None:
        """A collective timed out: the group runs no more collectives, and its connections close.

        The ranks that timed out and a rank that never came no longer agree on which collective is next
        (the latter would pair its next one with the frames of the abandoned one), so no later collective
        can be trusted. Like gloo, which closes its pairs, every member then fails its next collective at
        once (the declared AfterTimeout): here with this reason, a peer with 'rank N closed the connection'.
        """
        self._unusable = why
        self.mesh.close()

    def _check_agreement(self, seq: int, fingerprints: dict[int, dict]) -> None:
        """Raise the same error on every rank when ranks called different things."""
        problems = []
        keys = sorted({k for fp in fingerprints.values() if isinstance(fp, dict) for k in fp} - {"splits"})
        for key in keys:
            by_value: dict[str, list[int]] = {}
            for rank, fp in sorted(fingerprints.items()):
                value = fp.get(key) if isinstance(fp, dict) else None
                by_value.setdefault(repr(value), []).append(rank)
            if len(by_value) > 1:
                problems.append(f"{key} " + ", ".join(f"{value} on ranks {ranks}" for value, ranks in by_value.items()))
        if not problems and "splits" in fingerprints[self.rank()]:
            # all_to_all_single: what rank i sends to j must be what j expects from i
            for i, fp_i in fingerprints.items():
                for j, fp_j in fingerprints.items():
                    sent, expected = fp_i["splits"]["in"][j], fp_j["splits"]["out"][i]
                    if sent != expected:
                        problems.append(f"rank {i} sends {sent} rows to rank {j}, which expects {expected}")
        if problems:
            op = fingerprints[self.rank()].get("op")
            raise CollectiveMismatch(f"reference: ranks disagree on collective #{seq} ({op}): "
                                     + "; ".join(problems))

    # ---------------------------------------------------------- validation
    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self.size():
            raise ValueError(f"reference: {what} root {root} is not a rank of this group (0..{self.size() - 1})")

    def _check_peer(self, peer: int, what: str) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self.size():
            raise ValueError(f"reference: {what} rank {peer} is not a rank of this group (0..{self.size() - 1})")

    @staticmethod
    def _describe(tensor: torch.Tensor) -> dict:
        return {"dtype": wire.DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype)), "shape": list(tensor.shape)}

    @staticmethod
    def _reduce_op(opts) -> str:
        op = semantics.op_name(getattr(opts.reduceOp, "op", opts.reduceOp))
        return op

    @staticmethod
    def _premul_factor(opts) -> float | None:
        """The factor of a ReduceOp made by dist._make_nccl_premul_sum (None for other ops)."""
        if semantics.op_name(getattr(opts.reduceOp, "op", opts.reduceOp)) != "premul_sum":
            return None  # reading .factor of any other op raises
        if not hasattr(opts.reduceOp, "factor"):  # torch 2.11's binding keeps it in C++ (spec: a gap there)
            raise NotImplementedError("reference: this torch's ReduceOp exposes no premul_sum factor to Python "
                                      "(ReduceOp.factor)")
        factor = opts.reduceOp.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return factor

    # --------------------------------------------------------- collectives
    def allreduce(self, tensors, opts=None):
        # torch also calls pg.allreduce(tensor) with one tensor and no options (DDP's join
        # hook with find_unused_parameters), as c10d's ProcessGroup binding allows
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        opts = dist.AllreduceOptions() if opts is None else opts
        tensor = _single(tensors, "all_reduce")
        op, factor = self._reduce_op(opts), self._premul_factor(opts)
        if tensor.layout == torch.sparse_coo:
            return self._sparse_allreduce(tensor, op, opts)
        semantics.check_op_dtype(op, tensor.dtype)
        n = self.size()

        def run(seq, fp, deadline, timeout_s):
            data = tensor.detach().contiguous()
            if data.numel() * data.element_size() <= SMALL_ALL_REDUCE_BYTES:
                # one round: everybody gets everybody's tensor and reduces in rank order
                got = self._round(seq, fp, deadline, timeout_s, {p: data for p in range(n)})
                tensor.copy_(semantics.reduce_tensors(op, [got[r] for r in range(n)], factor))
                return [tensor]
            # two rounds: reduce-scatter (rank i owns chunk i), then all-gather the owned chunks
            chunks = list(data.reshape(-1).tensor_split(n))
            got = self._round(seq, fp, deadline, timeout_s, {p: chunks[p] for p in range(n)})
            mine = semantics.reduce_tensors(op, [got[r] for r in range(n)], factor)
            owned = self._round(seq, fp, deadline, timeout_s, {p: mine for p in range(n)}, step=1)
            result = tensor if tensor.is_contiguous() else torch.empty_like(data)
            for piece, value in zip(result.view(-1).tensor_split(n), (owned[r] for r in range(n))):
                piece.copy_(value)
            if result is not tensor:
                tensor.copy_(result)
            return [tensor]

        return self._submit("all_reduce", dict(self._describe(tensor), reduce=op, factor=factor), run, opts,
                            [tensor], [tensor])

    def _sparse_allreduce(self, tensor, op: str, opts) -> ReferenceWork:
        """Sparse COO: every rank sends its coalesced indices (step 0) and values (step 1)."""
        if op != "sum":
            raise ValueError(f"reference: sparse all_reduce supports ReduceOp.SUM only, got ReduceOp.{op.upper()}")
        n = self.size()

        def run(seq, fp, deadline, timeout_s):
            mine = tensor.detach().coalesce()
            indices = self._round(seq, fp, deadline, timeout_s, {p: mine.indices() for p in range(n)})
            values = self._round(seq, fp, deadline, timeout_s, {p: mine.values() for p in range(n)}, step=1)
            # a peer's indices are checked (in bounds, one column per value) before torch uses them
            inputs = [torch.sparse_coo_tensor(indices[r], values[r], tensor.shape, check_invariants=True)
                      for r in range(n)]
            tensor.copy_(semantics.sparse_all_reduce(inputs, op)[self.rank()])
            return [tensor]

        fingerprint = dict(self._describe(tensor), reduce=op, layout="sparse_coo", sparse_dims=tensor.sparse_dim())
        return self._submit("all_reduce", fingerprint, run, opts, [tensor], [tensor])

    # ---------------------------------------------------------- coalesced
    # One queued job each: one round per tensor (step i), the fingerprint (every tensor's
    # dtype and shape) checked at step 0.
    def allreduce_coalesced(self, tensors, opts=None):
        opts = dist.AllreduceCoalescedOptions() if opts is None else opts
        op, factor = self._reduce_op(opts), self._premul_factor(opts)
        for tensor in tensors:
            semantics.check_op_dtype(op, tensor.dtype)
        n = self.size()

        def run(seq, fp, deadline, timeout_s):
            for step, tensor in enumerate(tensors):
                got = self._round(seq, fp, deadline, timeout_s,
                                  {p: tensor.detach().contiguous() for p in range(n)}, step=step)
                tensor.copy_(semantics.reduce_tensors(op, [got[r] for r in range(n)], factor))
            return list(tensors)

        fingerprint = {"tensors": [self._describe(t) for t in tensors], "reduce": op, "factor": factor}
        return self._submit("all_reduce_coalesced", fingerprint, run, opts, tensors, tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        self._check_count(output_lists, "all_gather_coalesced output lists")
        for outputs in output_lists:
            if len(outputs) != len(input_list):
                raise ValueError(f"reference: all_gather_coalesced output list of {len(outputs)} tensors for "
                                 f"{len(input_list)} inputs")
        n = self.size()

        def run(seq, fp, deadline, timeout_s):
            for step, tensor in enumerate(input_list):
                got = self._round(seq, fp, deadline, timeout_s,
                                  {p: tensor.detach().contiguous() for p in range(n)}, step=step)
                for rank in range(n):
                    _copy_into(output_lists[rank][step], got[rank], f"all_gather_coalesced output [{rank}][{step}]")
            return [t for outputs in output_lists for t in outputs]

        fingerprint = {"tensors": [self._describe(t) for t in input_list]}
        return self._submit("all_gather_coalesced", fingerprint, run, opts, input_list,
                            [t for outputs in output_lists for t in outputs])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError(f"reference: all_gather_into_tensor_coalesced got {len(outputs)} outputs for "
                             f"{len(inputs)} inputs")
        n = self.size()
        for output, tensor in zip(outputs, inputs):
            if output.shape[0] != tensor.shape[0] * n:
                raise ValueError(f"reference: all_gather_into_tensor output of shape {list(output.shape)} is not "
                                 f"{n} x input of shape {list(tensor.shape)}")

        def run(seq, fp, deadline, timeout_s):
            for step, (output, tensor) in enumerate(zip(outputs, inputs)):
                got = self._round(seq, fp, deadline, timeout_s,
                                  {p: tensor.detach().contiguous() for p in range(n)}, step=step)
                for rank, piece in enumerate(output.chunk(n)):
                    _copy_into(piece, got[rank], f"all_gather_into_tensor_coalesced output {step} from rank {rank}")
            return list(outputs)

        fingerprint = {"tensors": [self._describe(t) for t in inputs]}
        return self._submit("all_gather_into_tensor_coalesced", fingerprint, run, opts,
                            inputs, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = dist.ReduceScatterOptions() if opts is None else opts
        if len(outputs) != len(inputs):
            raise ValueError(f"reference: reduce_scatter_tensor_coalesced got {len(outputs)} outputs for "
                             f"{len(inputs)} inputs")
        op, factor = self._reduce_op(opts), self._premul_factor(opts)
        n = self.size()
        for output, tensor in zip(outputs, inputs):
            semantics.check_op_dtype(op, tensor.dtype)
            if tensor.shape[0] != output.shape[0] * n:
                raise ValueError(f"reference: reduce_scatter_tensor input of shape {list(tensor.shape)} is not "
                                 f"{n} x output of shape {list(output.shape)}")

        def run(seq, fp, deadline, timeout_s):
            for step, (output, tensor) in enumerate(zip(outputs, inputs)):
                chunks = tensor.detach().chunk(n)
                got = self._round(seq, fp, deadline, timeout_s, {p: chunks[p].contiguous() for p in range(n)},
                                  step=step)
                _copy_into(output, semantics.reduce_tensors(op, [got[r] for r in range(n)], factor),
                           f"reduce_scatter_tensor_coalesced output {step}")
            return list(outputs)

        fingerprint = {"tensors": [self._describe(t) for t in inputs], "reduce": op, "factor": factor}
        return self._submit("reduce_scatter_tensor_coalesced", fingerprint, run, opts, inputs, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _start_coalescing(self, device=None):
        if self._coalesced is not None:
            raise RuntimeError("reference: _start_coalescing while already coalescing")
        self._coalesced = []

    def _end_coalescing(self, device=None):
        """One Work for every collective issued since _start_coalescing: done when all are, failed if any failed."""
        works, self._coalesced = self._coalesced or [], None
        return _all_of(works, "coalesced collectives", self.timeout.total_seconds())

    def broadcast(self, tensors, opts):
        tensor = _single(tensors, "broadcast")
        root = opts.rootRank
        self._check_root(root, "broadcast")

        def run(seq, fp, deadline, timeout_s):
            payloads = {p: tensor.detach().contiguous() for p in range(self.size())} if self.rank() == root else {}
            got = self._round(seq, fp, deadline, timeout_s, payloads)
            if self.rank() != root:
                tensor.copy_(got[root])
            return [tensor]

        return self._submit("broadcast", dict(self._describe(tensor), root=root), run, opts, [tensor], [tensor])

    def reduce(self, tensors, opts):
        tensor = _single(tensors, "reduce")
        root, op, factor = opts.rootRank, self._reduce_op(opts), self._premul_factor(opts)
        self._check_root(root, "reduce")
        semantics.check_op_dtype(op, tensor.dtype)

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {root: tensor.detach().contiguous()})
            if self.rank() == root:
                tensor.copy_(semantics.reduce([got[r] for r in range(self.size())], op, root, factor))
            return [tensor]

        return self._submit("reduce", dict(self._describe(tensor), root=root, reduce=op), run, opts,
                            [tensor], [tensor])

    def allgather(self, output_lists, input_tensors, opts):
        tensor = _single(input_tensors, "all_gather")
        outputs = _single(output_lists, "all_gather")
        self._check_count(outputs, "all_gather output list")

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {p: tensor.detach().contiguous() for p in range(self.size())})
            for rank, out in enumerate(outputs):
                _copy_into(out, got[rank], f"all_gather output {rank}")
            return outputs

        return self._submit("all_gather", self._describe(tensor), run, opts, [tensor], outputs)

    def all_gather_single(self, output, input, opts):
        if output.shape[0] != input.shape[0] * self.size():
            raise ValueError(f"reference: all_gather_into_tensor output of shape {list(output.shape)} is not "
                             f"{self.size()} x input of shape {list(input.shape)}")
        return self.allgather([list(output.chunk(self.size()))], [input], opts)

    _allgather_base = all_gather_single

    def gather(self, output_lists, input_tensors, opts):
        tensor = _single(input_tensors, "gather")
        root = opts.rootRank
        self._check_root(root, "gather")
        outputs = output_lists[0] if self.rank() == root else None
        if outputs is not None:
            self._check_count(outputs, "gather list at the root")

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {root: tensor.detach().contiguous()})
            if outputs is not None:
                for rank, out in enumerate(outputs):
                    _copy_into(out, got[rank], f"gather entry {rank}")
            return outputs or []

        return self._submit("gather", dict(self._describe(tensor), root=root), run, opts, [tensor],
                            outputs or [])

    def scatter(self, output_tensors, input_lists, opts):
        out = _single(output_tensors, "scatter")
        root = opts.rootRank
        self._check_root(root, "scatter")
        inputs = input_lists[0] if self.rank() == root else None
        if inputs is not None:
            self._check_count(inputs, "scatter list at the root")

        def run(seq, fp, deadline, timeout_s):
            payloads = {p: inputs[p].detach().contiguous() for p in range(self.size())} if inputs is not None else {}
            got = self._round(seq, fp, deadline, timeout_s, payloads)
            _copy_into(out, got[root], "scatter output")
            return [out]

        return self._submit("scatter", dict(self._describe(out), root=root), run, opts, inputs or [], [out])

    def reduce_scatter(self, output_tensors, input_lists, opts):
        out = _single(output_tensors, "reduce_scatter")
        inputs = _single(input_lists, "reduce_scatter")
        self._check_count(inputs, "reduce_scatter input list")
        op, factor = self._reduce_op(opts), self._premul_factor(opts)
        semantics.check_op_dtype(op, out.dtype)

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {p: inputs[p].detach().contiguous() for p in range(self.size())})
            _copy_into(out, semantics.reduce_tensors(op, [got[r] for r in range(self.size())], factor),
                       "reduce_scatter output")
            return [out]

        return self._submit("reduce_scatter", dict(self._describe(out), reduce=op, factor=factor), run, opts,
                            inputs, [out])

    def reduce_scatter_single(self, output, input, opts):
        if input.shape[0] != output.shape[0] * self.size():
            raise ValueError(f"reference: reduce_scatter_tensor input of shape {list(input.shape)} is not "
                             f"{self.size()} x output of shape {list(output.shape)}")
        return self.reduce_scatter([output], [list(input.chunk(self.size()))], opts)

    _reduce_scatter_base = reduce_scatter_single

    def alltoall(self, output_tensors, input_tensors, opts):
        self._check_count(output_tensors, "all_to_all output list")
        self._check_count(input_tensors, "all_to_all input list")

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s,
                              {p: input_tensors[p].detach().contiguous() for p in range(self.size())})
            for rank, out in enumerate(output_tensors):
                _copy_into(out, got[rank], f"all_to_all output {rank}")
            return output_tensors

        fingerprint = {"dtype": wire.DTYPE_NAMES.get(input_tensors[0].dtype)} if input_tensors else {}
        return self._submit("all_to_all", fingerprint, run, opts, input_tensors, output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        n = self.size()
        ins = semantics.split(input, input_split_sizes or None, n)
        outs = semantics.split(output, output_split_sizes or None, n)

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {p: ins[p].contiguous() for p in range(n)})
            for rank, piece in enumerate(outs):
                _copy_into(piece, got[rank], f"all_to_all_single rows from rank {rank}")
            return [output]

        splits = {"in": [t.shape[0] for t in ins], "out": [t.shape[0] for t in outs]}
        fingerprint = {"dtype": wire.DTYPE_NAMES.get(input.dtype), "row": list(input.shape[1:]), "splits": splits}
        return self._submit("all_to_all_single", fingerprint, run, opts, [input], [output])

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        def run(seq, fp, deadline, timeout_s):
            self._round(seq, fp, deadline, timeout_s)
            return []

        return self._submit("barrier", {}, run, opts)  # no tensors to record

    # ------------------------------------------------------------------ p2p
    def send(self, tensors, dst, tag):
        tensor = _single(tensors, "send")
        self._check_peer(dst, "send to")
        self._check_configured("send")
        return self._op_hooks.issue("send", True, dst, [tensor], [], lambda: self._send(tensor, dst, tag))

    def _send(self, tensor, dst, tag) -> ReferenceWork:
        work = ReferenceWork(f"send to rank {dst} tag {tag}", self.timeout.total_seconds())
        # torch's analyser reads a p2p call's group ranks from its name: "send <from>-><to>"
        work.fr_entry = self._fr_record(f"send {self.rank()}->{dst}", 0, [tensor], [tensor],
                                        self.timeout.total_seconds(), p2p=True)
        recorder().started(work.fr_entry)
        def written(error: Exception | None) -> None:  # on this thread, or the peer's writer's (Mesh.post)
            if error is None:
                work.complete([tensor])
            else:  # reported by wait(), like any backend's async error
                work.fail(RuntimeError(f"reference: send to rank {dst} (tag {tag}) failed: {error}"))

        try:  # returns at once, as gloo's send does: a peer that reads nothing holds the Work, not the caller
            deadline = time.monotonic() + self.timeout.total_seconds()
            self.mesh.connect([dst], deadline)
            self.mesh.post(dst, wire.P2P, tag, wire.tensor_meta(tensor), wire.tensor_bytes(tensor), deadline,
                           written)
        except Exception as exc:
            written(exc)
        return self._coalescing(work)

    def recv(self, tensors, src, tag):
        self._check_peer(src, "recv from")
        return self._hooked_recv(_single(tensors, "recv"), src, tag)

    def recv_anysource(self, tensors, tag):
        return self._hooked_recv(_single(tensors, "recv"), None, tag)

    def _hooked_recv(self, tensor, src, tag) -> ReferenceWork:
        self._check_configured("recv")
        return self._op_hooks.issue("recv", True, -1 if src is None else src, [], [tensor],
                                    lambda: self._post_recv(tensor, src, tag))

    def _post_recv(self, tensor, src, tag) -> ReferenceWork:
        what = f"recv from {'any rank' if src is None else f'rank {src}'} (tag {tag})"
        work = ReferenceWork(what, self.timeout.total_seconds())
        # "recv <to><-<from>", as torch's analyser parses it (from any rank: -1, as c10d says for any source)
        work.fr_entry = self._fr_record(f"recv {self.rank()}<-{-1 if src is None else src}", 0, [tensor], [tensor],
                                        self.timeout.total_seconds(), p2p=True)
        recorder().started(work.fr_entry)

        def arrived(sender, frame):
            if isinstance(frame, Exception):  # the sender's connection broke (Mailbox.fail_posted)
                work.fail(RuntimeError(f"reference: {what} failed: {frame}"))
                return
            meta, data = frame
            try:
                with torch.no_grad():  # runs in a reader thread, or the caller's: never record history (see _work_loop)
                    _copy_into(tensor, wire.tensor_from(meta, data), f"{what}: the message from rank {sender}")
            except Exception as exc:
                work.fail(exc)
                return
            work.source = sender
            work.complete([tensor])

        try:  # a lazy group's pair connects here (from any source: every pair), within the group's timeout
            self.mesh.connect(range(self.size()) if src is None else [src],
                              time.monotonic() + self.timeout.total_seconds())
        except PeerError as exc:
            work.fail(RuntimeError(f"reference: {what} failed: {exc}"))
            return self._coalescing(work)
        posted = self.mesh.mailbox.post(src, tag, arrived)
        if posted is not None:
            work.on_timeout = lambda: self.mesh.mailbox.cancel(posted)
            failure = self.mesh.failure_for([src] if src is not None else [])
            if failure and self.mesh.mailbox.cancel(posted):
                work.fail(failure)
        return self._coalescing(work)

    # ------------------------------------------------------------ shrinking
    @property
    def supports_shrinking(self) -> bool:
        """torch's shrink_group asks the group's device backend (this group, _get_backend(cpu)); it can only take
        a C++ Backend back, which Python can subclass from torch 2.14 on (backend_form.py)."""
        return backend_form.AVAILABLE

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts_override=None):
        """Backend.shrink, as torch's shrink_group calls it on the ranks that stay: a group of the remaining ranks,
        numbered in their order, over this group's store under a prefix of its own (every remaining rank counts
        its shrinks of this group alike), with ``opts_override``'s timeout if it has one, else this group's.
        SHRINK_ABORT aborts this group's operations first; torch destroys this group afterwards either way."""
        excluded = {int(r) for r in ranks_to_exclude}
        remaining = [r for r in range(self.size()) if r not in excluded]
        if self.rank() not in remaining:
            raise RuntimeError(f"reference: rank {self.rank()} is excluded by the shrink it was asked to take part "
                               "in; only the remaining ranks shrink a group")
        if shrink_flags & dist.distributed_c10d.SHRINK_ABORT:
            self.abort()
        timeout = getattr(opts_override, "_timeout", None) or self.timeout
        self._shrinks += 1
        group = type(self)(dist.PrefixStore(f"reference/shrink/{self._shrinks}", self.store),
                           remaining.index(self.rank()), len(remaining), timeout,
                           global_ranks=[self.global_ranks[r] for r in remaining], host=self._host)
        return backend_form.ReferenceBackend(group)

    # ------------------------------------------------------------ merging
    def merge_remote_group(self, store, size: int, timeout: timedelta = timedelta(minutes=30),
                           group_name: str | None = None, group_desc: str | None = None):
        """ProcessGroup.merge_remote_group as c10d's C++ merge does it for its own backends: a rank per group in
        the order the groups reach ``store`` (its "mergeGroupRank" counter), a new group of ``size`` over that
        store with the given timeout, named and described as given (else this group's with ":merge"). c10d's merge
        of a Python group asks the group's per-device Backends, of which the reference registers none, and returns
        None; the merged group is unknown to c10d's Python registry, like any merged group (shutdown() ends it)."""
        merged = self.merged(store, store.add("mergeGroupRank", 1) - 1, size, timeout)
        merged._set_group_name(group_name if group_name is not None else f"{self.getGroupName()}:merge")
        merged._set_group_desc(group_desc if group_desc is not None else f"{self.getGroupDesc()}:merge")
        return merged

    def merged(self, store, rank: int, size: int, timeout: timedelta) -> ReferenceProcessGroup:
        """Rank ``rank`` of a merged group of ``size`` over ``store``, as c10d counted the merging ranks on it: what
        merge_remote_group (this form) and the Backend form's merge (backend_form.py) make."""
        return type(self)(dist.PrefixStore("reference/merge", store), rank, size, timeout)

    # ----------------------------------------------------------- life cycle
    def _check_count(self, tensors, what: str) -> None:
        if len(tensors) != self.size():
            raise ValueError(f"reference: {what} has {len(tensors)} tensors; the group has {self.size()} ranks")

    def set_timeout(self, timeout):
        self.timeout = timeout

    def shutdown(self):
        self._jobs.put(None)
        if self._mesh is not None:
            self._mesh.close()

    def abort(self):
        self._faults.error = "COMM_ERROR"  # an explicit abort revokes the group, as NCCL2 reports it; no abort hooks
        self.shutdown()

    # ------------------------------------------- fault tolerance (torch 2.14)
    def _check_configured(self, what: str) -> None:
        if self._mesh is None:
            raise RuntimeError(f"reference: {what}: the group has no communicator yet; call reconfigure() before "
                               "issuing operations when enable_reconfigure=True")

    @property
    def supports_reconfigure(self) -> bool:
        return True

    def get_reconfigure_handle(self) -> str:
        return self._handle

    def reconfigure(self, opts) -> ReferenceWork:
        """A new communicator of the ranks whose handles ``opts.handles`` names, under the fresh ``opts.uuid``
        (fault_tolerance.py). Every listed rank makes it at once, over this group's store: the old one's worker
        and connections end, the new one numbers operations from scratch and reports SUCCESS."""
        place = self._place(opts)
        self._used_uuids.add(opts.uuid)
        timeout = opts.timeout if opts.timeout is not None else self.timeout
        old_worker = self._worker
        self.shutdown()  # the old worker fails what it still holds on the closed connections, then ends
        # before the new communicator exists: a job of the old one must never run over the new connections
        old_worker.join(timeout.total_seconds())
        self._mesh = Mesh(dist.PrefixStore(f"reference/reconfigure/{opts.uuid}", self.store), place.rank, place.size,
                         timeout, host=self._host)
        self._rank, self._size = place.rank, place.size
        self.global_ranks = list(range(place.size))
        self._seq, self._unusable = 0, None
        self._faults.error = "SUCCESS"
        self._start_worker()
        work = ReferenceWork(f"reconfigure (uuid {opts.uuid})", timeout.total_seconds())
        work.complete([])
        return work

    def _place(self, opts) -> fault_tolerance.Membership:
        """Where this rank stands in the communicator ``opts`` describes (the request checked first)."""
        return fault_tolerance.membership(opts.uuid, opts.handles, self._handle, self._used_uuids)

    def get_error(self):
        return self._faults.error_type()

    def register_abort_hook(self, hook_id: int, hook) -> None:
        self._faults.register_abort_hook(hook_id, hook)

    def unregister_abort_hook(self, hook_id: int) -> None:
        self._faults.unregister_abort_hook(hook_id)

    def register_pre_hook(self, hook_id: int, hook) -> None:
        self._op_hooks.pre[hook_id] = hook

    def register_post_hook(self, hook_id: int, hook) -> None:
        self._op_hooks.post[hook_id] = hook

    def unregister_pre_hook(self, hook_id: int) -> None:
        self._op_hooks.pre.pop(hook_id, None)

    def unregister_post_hook(self, hook_id: int) -> None:
        self._op_hooks.post.pop(hook_id, None)


def _all_of(works: list[ReferenceWork], what: str, timeout_s: float) -> ReferenceWork:
    combined = ReferenceWork(f"{what} ({len(works)} operations)", timeout_s)
    if not works:
        combined.complete([])
        return combined

    def finished(_):
        errors = [e for e in (w.exception() for w in works) if e is not None]
        if errors:
            combined.fail(errors[0])
        else:
            combined.complete([t for w in works for t in w.future.value()])

    torch.futures.collect_all([w.future for w in works]).add_done_callback(finished)
    return combined


def _single(tensors, what: str):
    if len(tensors) != 1:
        raise ValueError(f"reference: {what} takes exactly one tensor (or list) per rank, got {len(tensors)}")
    return tensors[0]


def _copy_into(out: torch.Tensor, value: torch.Tensor, what: str) -> None:
    """Copy a received value into the caller's tensor, which must match it exactly."""
    if value is None:
        raise RuntimeError(f"reference: {what}: no data was sent")
    if out.dtype != value.dtype or tuple(out.shape) != tuple(value.shape):
        raise RuntimeError(f"reference: {what}: got {wire.DTYPE_NAMES.get(value.dtype)} {list(value.shape)}, "
                           f"expected {wire.DTYPE_NAMES.get(out.dtype)} {list(out.shape)}")
    out.copy_(value)
