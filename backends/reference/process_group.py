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
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from . import semantics, wire
from .transport import Mesh, PeerError, RecvTimeout

SMALL_ALL_REDUCE_BYTES = 64 * 1024  # below: one round (all-gather, reduce locally); above: two


# C++ callers (DDP's reducer keeps the Join all_reduce's Work to wait() and
# result() on it a whole backward pass later) hold only the C++ half of a
# Python Work. Once Python drops its last reference the overrides below are
# gone and C++ falls through to c10d's base Work (wait() never returns,
# getFuture() "not implemented"). So the group keeps every Work alive while
# it is in flight and the most recent completed ones after that.
_WORKS_IN_FLIGHT: set = set()
_WORKS_RECENT: collections.deque = collections.deque(maxlen=4096)


class ReferenceWork(dist.Work):
    """A Work backed by a torch Future, with the group's timeout on wait()."""

    def __init__(self, what: str, timeout_s: float, on_timeout=None):
        super().__init__()
        self.future = torch.futures.Future()
        self.what, self.timeout_s, self.on_timeout = what, timeout_s, on_timeout
        self.source = -1
        self._done = threading.Event()
        _WORKS_IN_FLIGHT.add(self)

    def complete(self, value) -> None:
        self.future.set_result(value)
        self._finished()

    def fail(self, error: Exception) -> None:
        self.future.set_exception(error)
        self._finished()

    def _finished(self) -> None:
        self._done.set()
        _WORKS_RECENT.append(self)
        _WORKS_IN_FLIGHT.discard(self)

    def wait(self, timeout=None):
        limit = self.timeout_s if timeout is None or timeout.total_seconds() <= 0 else timeout.total_seconds()
        if not self._done.wait(limit):
            if self.on_timeout is None or self.on_timeout():
                raise RuntimeError(f"reference: {self.what} timed out after {limit:g} s")
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

    def _source_rank(self):
        return self.source

    def source_rank(self):
        return self.source


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
        if thread.name.startswith(("reference-worker", "reference-read")):
            thread.join(max(0.0, deadline - time.monotonic()))


class ReferenceProcessGroup(dist.ProcessGroup):
    """A c10d process group over its own TCP mesh; see the module docstring."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, global_ranks=None, host=None):
        super().__init__(rank, size)
        self.timeout = timeout
        self.global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self.mesh = Mesh(store, rank, size, timeout, host=host)
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work_loop, name=f"reference-worker-r{rank}", daemon=True)
        self._worker.start()
        _LIVE_GROUPS.add(self)

    # ----------------------------------------------------------- identity
    def getBackendName(self):
        return "reference"

    def _get_backend_name(self):
        return "reference"

    # A Python ProcessGroup has no registered backend to keep its name on.
    def _set_group_name(self, name):
        self._group_name = name

    def getGroupName(self):
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return getattr(self, "_group_desc", "")

    def __repr__(self):
        return f"<ReferenceProcessGroup rank {self.rank()}/{self.size()} global ranks {self.global_ranks}>"

    # ------------------------------------------------------------ running
    def _submit(self, name: str, fingerprint: dict, run, opts_timeout=None) -> ReferenceWork:
        """Queue a collective; ``run(seq, deadline)`` does the work in the group's worker thread."""
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        timeout_s = _seconds(opts_timeout, self.timeout)
        # the worker enforces the timeout itself; wait() only guards against a wedged worker
        work = ReferenceWork(f"{name} (collective #{seq})", timeout_s + 60)
        self._jobs.put((work, seq, dict(fingerprint, op=name), run, timeout_s))
        return work

    def _work_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, seq, fingerprint, run, timeout_s = job
            try:
                result = run(seq, fingerprint, time.monotonic() + timeout_s, timeout_s)
            except Exception as exc:
                work.fail(exc)
            else:
                work.complete(result)

    def _round(self, seq: int, fingerprint: dict, deadline: float, timeout_s: float,
               payloads: dict[int, torch.Tensor] | None = None, step: int = 0) -> dict[int, torch.Tensor | None]:
        """Send every peer our fingerprint and its payload; gather theirs; check agreement.

        Returns peer -> the tensor that peer sent us (None if it sent none),
        including ourselves (our payload to ourselves, without a copy).
        """
        me, peers = self.rank(), [p for p in range(self.size()) if p != self.rank()]
        payloads = payloads or {}
        for peer in peers:
            tensor = payloads.get(peer)
            meta = {"seq": seq, "step": step, "fp": fingerprint if step == 0 else None}
            if tensor is not None:
                meta.update(wire.tensor_meta(tensor))
                self.mesh.send(peer, wire.COLL, 0, meta, wire.tensor_bytes(tensor))
            else:
                self.mesh.send(peer, wire.COLL, 0, meta)
        keys = [("coll", seq, step, peer) for peer in peers]
        try:
            frames = self.mesh.mailbox.take(keys, deadline, lambda missing: self.mesh.failure_for(
                [key[3] for key in missing]))
        except RecvTimeout as timeout:
            missing = sorted(key[3] for key in timeout.args[0])
            raise RuntimeError(
                f"reference: {fingerprint['op']} (collective #{seq}) timed out after {timeout_s:g} s on rank "
                f"{me}: no message from group ranks {missing} (global ranks "
                f"{[self.global_ranks[r] for r in missing]})") from None
        except PeerError as exc:
            raise RuntimeError(f"reference: {fingerprint['op']} (collective #{seq}) failed: {exc}") from None
        received: dict[int, torch.Tensor | None] = {me: payloads.get(me)}
        fingerprints = {me: fingerprint}
        for (_, _, _, peer), (meta, data) in frames.items():
            fingerprints[peer] = meta.get("fp")
            received[peer] = wire.tensor_from(meta, data) if "dtype" in meta else None
        if step == 0:
            self._check_agreement(seq, fingerprints)
        return received

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

    # --------------------------------------------------------- collectives
    def allreduce(self, tensors, opts=None):
        # torch also calls pg.allreduce(tensor) with one tensor and no options (DDP's join
        # hook with find_unused_parameters), as c10d's ProcessGroup binding allows
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        opts = dist.AllreduceOptions() if opts is None else opts
        tensor = _single(tensors, "all_reduce")
        op = self._reduce_op(opts)
        semantics.check_op_dtype(op, tensor.dtype)
        n = self.size()

        def run(seq, fp, deadline, timeout_s):
            data = tensor.detach().contiguous()
            if data.numel() * data.element_size() <= SMALL_ALL_REDUCE_BYTES:
                # one round: everybody gets everybody's tensor and reduces in rank order
                got = self._round(seq, fp, deadline, timeout_s, {p: data for p in range(n)})
                tensor.copy_(semantics.reduce_tensors(op, [got[r] for r in range(n)]))
                return [tensor]
            # two rounds: reduce-scatter (rank i owns chunk i), then all-gather the owned chunks
            chunks = list(data.reshape(-1).tensor_split(n))
            got = self._round(seq, fp, deadline, timeout_s, {p: chunks[p] for p in range(n)})
            mine = semantics.reduce_tensors(op, [got[r] for r in range(n)])
            owned = self._round(seq, fp, deadline, timeout_s, {p: mine for p in range(n)}, step=1)
            result = tensor if tensor.is_contiguous() else torch.empty_like(data)
            for piece, value in zip(result.view(-1).tensor_split(n), (owned[r] for r in range(n))):
                piece.copy_(value)
            if result is not tensor:
                tensor.copy_(result)
            return [tensor]

        return self._submit("all_reduce", dict(self._describe(tensor), reduce=op), run, opts.timeout)

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

        return self._submit("broadcast", dict(self._describe(tensor), root=root), run, opts.timeout)

    def reduce(self, tensors, opts):
        tensor = _single(tensors, "reduce")
        root, op = opts.rootRank, self._reduce_op(opts)
        self._check_root(root, "reduce")
        semantics.check_op_dtype(op, tensor.dtype)

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {root: tensor.detach().contiguous()})
            if self.rank() == root:
                tensor.copy_(semantics.reduce(list(got[r] for r in range(self.size())), op, root))
            return [tensor]

        return self._submit("reduce", dict(self._describe(tensor), root=root, reduce=op), run, opts.timeout)

    def allgather(self, output_lists, input_tensors, opts):
        tensor = _single(input_tensors, "all_gather")
        outputs = _single(output_lists, "all_gather")
        self._check_count(outputs, "all_gather output list")

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {p: tensor.detach().contiguous() for p in range(self.size())})
            for rank, out in enumerate(outputs):
                _copy_into(out, got[rank], f"all_gather output {rank}")
            return outputs

        return self._submit("all_gather", self._describe(tensor), run, opts.timeout)

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

        return self._submit("gather", dict(self._describe(tensor), root=root), run, opts.timeout)

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

        return self._submit("scatter", dict(self._describe(out), root=root), run, opts.timeout)

    def reduce_scatter(self, output_tensors, input_lists, opts):
        out = _single(output_tensors, "reduce_scatter")
        inputs = _single(input_lists, "reduce_scatter")
        self._check_count(inputs, "reduce_scatter input list")
        op = self._reduce_op(opts)
        semantics.check_op_dtype(op, out.dtype)

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {p: inputs[p].detach().contiguous() for p in range(self.size())})
            _copy_into(out, semantics.reduce_tensors(op, [got[r] for r in range(self.size())]), "reduce_scatter output")
            return [out]

        return self._submit("reduce_scatter", dict(self._describe(out), reduce=op), run, opts.timeout)

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
        return self._submit("all_to_all", fingerprint, run, opts.timeout)

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
        return self._submit("all_to_all_single", fingerprint, run, opts.timeout)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        def run(seq, fp, deadline, timeout_s):
            self._round(seq, fp, deadline, timeout_s)
            return []

        return self._submit("barrier", {}, run, getattr(opts, "timeout", None))

    # ------------------------------------------------------------------ p2p
    def send(self, tensors, dst, tag):
        tensor = _single(tensors, "send")
        self._check_peer(dst, "send to")
        work = ReferenceWork(f"send to rank {dst} tag {tag}", self.timeout.total_seconds())
        try:
            self.mesh.send(dst, wire.P2P, tag, wire.tensor_meta(tensor), wire.tensor_bytes(tensor))
            work.complete([tensor])
        except Exception as exc:  # reported by wait(), like any backend's async error
            work.fail(RuntimeError(f"reference: send to rank {dst} (tag {tag}) failed: {exc}"))
        return work

    def recv(self, tensors, src, tag):
        self._check_peer(src, "recv from")
        return self._post_recv(_single(tensors, "recv"), src, tag)

    def recv_anysource(self, tensors, tag):
        return self._post_recv(_single(tensors, "recv"), None, tag)

    def _post_recv(self, tensor, src, tag) -> ReferenceWork:
        what = f"recv from {'any rank' if src is None else f'rank {src}'} (tag {tag})"
        work = ReferenceWork(what, self.timeout.total_seconds())

        def arrived(sender, frame):
            if isinstance(frame, Exception):  # the sender's connection broke (Mailbox.fail_posted)
                work.fail(RuntimeError(f"reference: {what} failed: {frame}"))
                return
            meta, data = frame
            try:
                _copy_into(tensor, wire.tensor_from(meta, data), f"{what}: the message from rank {sender}")
            except Exception as exc:
                work.fail(exc)
                return
            work.source = sender
            work.complete([tensor])

        posted = self.mesh.mailbox.post(src, tag, arrived)
        if posted is not None:
            work.on_timeout = lambda: self.mesh.mailbox.cancel(posted)
            failure = self.mesh.failure_for([src] if src is not None else [])
            if failure and self.mesh.mailbox.cancel(posted):
                work.fail(failure)
        return work

    # ----------------------------------------------------------- life cycle
    def _check_count(self, tensors, what: str) -> None:
        if len(tensors) != self.size():
            raise ValueError(f"reference: {what} has {len(tensors)} tensors; the group has {self.size()} ranks")

    def set_timeout(self, timeout):
        self.timeout = timeout

    def shutdown(self):
        self._jobs.put(None)
        self.mesh.close()

    def abort(self):
        self.shutdown()


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
