"""The FAST-mode distributed backward pass (PyTorch PR 27022; torch/csrc/distributed/autograd/engine/).

One ``BackwardPass`` per (context, worker) and backward: created by
``backward()`` on the worker that calls it (its roots are sources) or by the
first propagate-gradients request of the pass reaching another worker.

Sources are the roots (seed: ones) and *every* send function of the context
(FAST mode assumes each one takes part: each receives its gradients exactly
once per pass, from the peer's recv function). Sinks are the leaves (their
gradients accumulate into the context, never into ``.grad``) and the recv
functions (their gradients go back to the worker that sent the message).
The local engine is torch's: ``torch.autograd.backward`` from the sources
that are ready, so hooks, dtype casts and freed-buffer errors are torch's
own. As in torch's engine (DistAccumulateGradCaptureHook) a leaf's
AccumulateGrad node runs with its pre and post hooks (DDP's reducer hooks
there), a pre hook registered for the run taking the gradient for the
context and leaving none for ``.grad``; a pre hook on each recv node takes
the gradients flowing into it (``_run_engine``).

Why per source rather than one local run: a source's gradients may arrive
only after this worker's other parts ran (A -> B -> A: A's nested response
needs B's gradients, which need A's loss part first). Gradients are linear,
so each source's run contributes its share:

* a leaf accumulates each share as it comes;
* a recv function sends once, when every source that reaches it has run
  (the graph across workers is acyclic, so this never waits on itself);
* a run keeps the graph (``retain_graph=True``) while a source still to run
  shares a node with it, so the last run through a node frees its buffers
  exactly when the user asked (a second pass then fails with torch's text).

A worker's pass is done when every source ran and every propagate request it
sent was answered. The first request to a worker is answered only then;
later ones at once (their work joins the running pass). ``backward()``
returns when the caller's pass is done, so when every worker's is. An error
anywhere fails the pass with ``Error on Node {worker}: `` prepended on every
hop back to the caller (torch's texts).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from functools import partial

import torch

from . import messages
from .requests import outcome_text, send_propagate
from .container import CONTAINER, DistAutogradContext
from ... import grad_context
from .functions import RecvRecord, is_recv_node

log = logging.getLogger(__name__)

# torch's texts (dist_engine.cpp validateRootsAndRetrieveEdges, recvrpc_backward.cpp)
NO_ROOTS = "No tensors provided for gradient computation."
ROOT_NO_GRAD = "requires_grad not set on root"
ROOT_NOT_SCALAR = " is not a scalar, all roots need to be scalar"
ROOT_NO_FN = " does not have a valid gradient function."
CONTEXT_GONE = ("Autograd context no longer valid! This usually means the autograd context was cleaned up by a "
                "different thread due to an error before RecvRcpBackward had a chance to run")
NO_SEND_FUNCTION = "Could not find send function for autograd message id: {}"
ALREADY_RUNNING = "distributed backward is already running for autograd context {} on this worker"
# ours: torch's FAST mode hangs here (spec B9); a reference agent says why, within the RPC timeout
UNUSED_SEND = ("distributed backward of autograd context {context} did not complete within {timeout:g} s: "
               "{waiting} never received gradients. FAST mode needs every RPC recorded in the context "
               "(every send function) to contribute to the roots")


class _Source:
    """One source of a pass: a root or a send function, with what it reaches on this worker."""

    __slots__ = ("key", "output", "seed", "nodes", "leaves", "recvs", "done", "ready")

    def __init__(self, key, output, seed):
        self.key, self.output, self.seed = key, output, seed
        self.nodes: set = set()
        self.leaves: list = []
        self.recvs: list[RecvRecord] = []
        self.done = False
        self.ready = seed is not None


def _walk(source: _Source, recv_by_node: dict) -> None:
    """Every autograd node, leaf and recv function reachable from ``source`` on this worker."""
    start = source.output.grad_fn
    stack, seen, interior, leaves, recvs = [start], set(), set(), {}, {}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if is_recv_node(node):  # a sink: the graph continues on the worker that sent the message
            record = recv_by_node.get(node)
            if record is not None:
                recvs[record.msg_id] = record
            continue
        variable = getattr(node, "variable", None)
        if variable is not None and type(node).__name__ == "AccumulateGrad":
            leaves[id(variable)] = node  # the leaf's AccumulateGrad node (its variable is the leaf)
            continue
        interior.add(node)  # may hold saved tensors: what retain_graph is about (leaves and sinks hold none)
        stack.extend(fn for fn, _ in node.next_functions)
    source.nodes, source.leaves, source.recvs = interior, list(leaves.values()), list(recvs.values())


class BackwardPass:
    """This worker's part of one distributed backward pass of ``context``."""

    def __init__(self, context: DistAutogradContext, roots: list, retain_graph: bool, agent):
        self.context = context
        self.agent = agent
        self.me = agent.rank
        self.retain_graph = retain_graph
        self.future = torch.futures.Future()
        self.lock = threading.RLock()
        self.outstanding = 0
        self.finished = False
        self.started = time.monotonic()
        # The caller's pass: its thread, waiting in wait(), runs what becomes ready (True put
        # here) in its own thread-local state (profiler, grad mode), as torch's graph task
        # runs its nodes under the caller's ThreadLocalState. None: run on the delivering thread.
        self.runner: queue.SimpleQueue | None = None
        recv_by_node = {record.node: record for record in context.recv.values()}
        self.sources: dict = {}
        for i, root in enumerate(roots):
            self.sources[("root", i)] = _Source(("root", i), root, torch.ones_like(root))
        for msg_id, send in sorted(context.send.items()):
            self.sources[("send", msg_id)] = _Source(("send", msg_id), send.output, None)
        self.waiting_recvs: dict[int, set] = {}  # recv msg id -> sources still to run that reach it
        self.recv_grads: dict[int, list] = {}
        self.recvs: dict[int, RecvRecord] = {}
        for source in self.sources.values():
            _walk(source, recv_by_node)
            for record in source.recvs:
                self.waiting_recvs.setdefault(record.msg_id, set()).add(source.key)
                self.recv_grads.setdefault(record.msg_id, [None] * len(record.shapes))
                self.recvs[record.msg_id] = record

    # ------------------------------------------------------------ feeding
    def deliver(self, msg_id: int, grads: list) -> None:
        """A peer propagated ``grads`` to send function ``msg_id``: run it."""
        with self.lock:
            source = self.sources.get(("send", msg_id))
            if source is None or source.ready:
                # not a send function of this pass, or it got gradients twice (FAST mode: once)
                raise RuntimeError(f"send function {msg_id} of autograd context {self.context.id} is not "
                                   "waiting for gradients in this backward pass")
            source.seed = grads
            source.ready = True
            runner = self.runner
        if runner is not None:
            runner.put(True)  # the caller's thread runs it (wait())
        else:
            self.run_ready()

    def run_ready(self) -> None:
        """Run every source that has its gradients and has not run yet (one local engine call)."""
        sends = []
        with self.lock:
            if self.finished:
                return
            batch = [s for s in self.sources.values() if s.ready and not s.done]
            if not batch:
                return
            try:
                sends = self._run(batch)
            except Exception as exc:  # a backward function raised, buffers freed, ...
                self.fail(f"Error on Node {self.me}: {exc}")
                return
        for record, grads in sends:
            self._propagate(record, grads)
        self._maybe_done()

    def _run(self, batch: list[_Source]) -> list:
        outputs, seeds, nodes = [], [], set()
        leaves, recvs = {}, {}
        for source in batch:
            if source.key[0] == "send":
                self.context.send[source.key[1]].node.grads = source.seed
                outputs.append(source.output)
                seeds.append(torch.empty(0))
            else:
                outputs.append(source.output)
                seeds.append(source.seed)
            nodes |= source.nodes
            for leaf in source.leaves:
                leaves[id(leaf.variable)] = leaf  # AccumulateGrad nodes, one per leaf
            for record in source.recvs:
                recvs[record.msg_id] = record
        later = [s for s in self.sources.values() if not s.done and s not in batch]
        # keep the graph while a source still to run shares a node with this run
        retain = self.retain_graph or any(nodes & s.nodes for s in later)
        # leaf gradients go into the context as the engine reaches each leaf (the capture hook)
        recv_grads = _run_engine(self.context, outputs, seeds, list(leaves.values()), list(recvs.values()), retain)
        for source in batch:
            source.done = True
            source.seed = None
        for msg_id, grads in recv_grads.items():
            acc = self.recv_grads[msg_id]
            for i, grad in enumerate(grads):
                if grad is not None:
                    acc[i] = grad if acc[i] is None else acc[i] + grad
        sends = []
        for msg_id in recvs:
            waiting = self.waiting_recvs[msg_id]
            waiting.difference_update(s.key for s in batch)
            if not waiting:
                record = self.recvs[msg_id]
                # torch's RecvRpcBackward: zeros for a gradient that is undefined
                grads_out = [g if g is not None else messages.zeros_for(shape, dtype)
                             for g, (shape, dtype) in zip(self.recv_grads.pop(msg_id), record.shapes)]
                self.outstanding += 1
                sends.append((record, grads_out))
        return sends

    # ------------------------------------------------------------ peers
    def _propagate(self, record: RecvRecord, grads: list) -> None:
        try:
            fut = send_propagate(self.agent, record.src, self.context.id, record.msg_id,
                                         self.retain_graph, grads)
        except Exception as exc:
            self._answered(f"{exc}")
            return
        fut.add_done_callback(lambda done: self._answered(outcome_text(done)))

    def _answered(self, error: str | None) -> None:
        with self.lock:
            self.outstanding -= 1
        if error is not None:
            self.fail(f"Error on Node {self.me}: {error}")
        else:
            self._maybe_done()

    # ------------------------------------------------------------ ending
    def _maybe_done(self) -> None:
        with self.lock:
            if self.finished or self.outstanding or any(not s.done for s in self.sources.values()):
                return
            self.finished = True
            self._detach()
        self.future.set_result(None)

    def fail(self, text: str) -> None:
        with self.lock:
            if self.finished:
                return
            self.finished = True
            self._detach()
        self.future.set_exception(RuntimeError(text))

    def _detach(self) -> None:
        with self.context.lock:
            if self.context.backward is self:
                self.context.backward = None  # the next backward on this context rebuilds

    def waiting_for(self) -> list:
        with self.lock:
            return [s.key for s in self.sources.values() if not s.done]


_running = threading.local()  # .capture: the _Capture of the engine run on this thread


class _Capture:
    """What one local engine run captures: leaf gradients (at their AccumulateGrad, into the context)
    and recv inputs."""

    def __init__(self, context: DistAutogradContext):
        self.context = context
        self.recvs: dict = {}  # recv msg id -> gradients flowing into its recv node
        self.outer: list = []  # grad_context's previous value, per leaf whose hooks are running

    def leaf_prehook(self, node, grads):
        """torch's DistAccumulateGradCaptureHook: after the node's own pre hooks (registered earlier),
        accumulate the gradient into the context and leave none for ``.grad``; the node's post hooks
        still run (DDP's reducer hooks there), with this context as the thread's (``leaf_posthook``
        restores): the reducer reads the gradient from it and writes the averaged one back."""
        if getattr(_running, "capture", None) is not self:
            return None  # another thread's engine run (a local backward, another pass)
        if grads[0] is not None:
            self.context.accumulate(node.variable, grads[0])
        self.outer.append(grad_context.enter(self.context))
        return (None,)

    def leaf_posthook(self, grad_inputs, grad_outputs):
        """Registered after every other post hook of the node: the end of torch's context guard."""
        if getattr(_running, "capture", None) is self and self.outer:
            grad_context.leave(self.outer.pop())

    def recv_prehook(self, msg_id, grads):
        if getattr(_running, "capture", None) is self:
            self.recvs[msg_id] = grads
        return None


def _run_engine(context: DistAutogradContext, outputs: list, seeds: list, leaf_nodes: list, recvs: list,
                retain: bool) -> dict:
    """Run torch's engine from ``outputs``, executing the leaves' AccumulateGrad nodes (their hooks run,
    as in torch's distributed engine) with the gradient captured for the context, ``.grad`` untouched.

    CPU backward runs on the calling thread, so a thread-local marks whose run a hook sees.
    """
    capture = _Capture(context)
    handles = [node.register_prehook(partial(capture.leaf_prehook, node)) for node in leaf_nodes]
    handles += [node.register_hook(capture.leaf_posthook) for node in leaf_nodes]
    handles += [record.node.register_prehook(partial(capture.recv_prehook, record.msg_id)) for record in recvs]
    # torch's capture never runs AccumulateGrad itself, so the leaf's post-accumulate-grad hooks do not run
    muted = [(node.variable, dict(hooks)) for node in leaf_nodes
             if (hooks := getattr(node.variable, "_post_accumulate_grad_hooks", None))]
    for variable, _ in muted:
        variable._post_accumulate_grad_hooks.clear()
    outer, _running.capture = getattr(_running, "capture", None), capture
    try:
        if leaf_nodes or recvs:
            torch.autograd.backward(outputs, seeds, retain_graph=retain)
    finally:
        _running.capture = outer
        while capture.outer:  # a hook raised between a leaf's pre and post hooks
            grad_context.leave(capture.outer.pop())
        for variable, hooks in muted:
            variable._post_accumulate_grad_hooks.update(hooks)
        for handle in handles:
            handle.remove()
    return capture.recvs


def _validate_roots(roots) -> list:
    if not roots:
        raise RuntimeError(NO_ROOTS)
    for root in roots:
        if not root.requires_grad:
            raise RuntimeError(ROOT_NO_GRAD)
        if root.numel() != 1:
            raise RuntimeError(ROOT_NOT_SCALAR)
        if root.grad_fn is None:
            raise RuntimeError(ROOT_NO_FN)
    return list(roots)


def start_backward(context_id: int, roots, retain_graph: bool, agent) -> BackwardPass:
    """Validate and start the caller's pass (checks in torch's order); ``pass.future`` completes at its end."""
    context = CONTAINER.retrieve(context_id)
    roots = _validate_roots(roots)
    with context.lock:
        if context.backward is not None:
            raise RuntimeError(ALREADY_RUNNING.format(context_id))
        backward = context.backward = BackwardPass(context, roots, retain_graph, agent)
        backward.runner = queue.SimpleQueue()  # this thread drives the pass (wait())
    backward.run_ready()
    return backward


def wait(backward: BackwardPass, timeout: float) -> None:
    """Wait for the caller's pass; bounded, unlike torch's FAST mode (see ``UNUSED_SEND``).

    While a propagate request is outstanding its own RPC timeout bounds the
    wait; with none outstanding and sources still waiting after ``timeout``,
    no gradient can come any more: fail, naming them.
    """
    runner = backward.runner
    if runner is None:  # not started by start_backward: nothing for this thread to run
        runner = backward.runner = queue.SimpleQueue()
    backward.future.add_done_callback(lambda _: runner.put(None))
    while not backward.future.done():
        try:
            item = runner.get(timeout=timeout if timeout > 0 else None)
        except queue.Empty:
            if backward.outstanding == 0 and not backward.future.done():
                waiting = [f"send function {key[1]}" for key in backward.waiting_for() if key[0] == "send"]
                backward.fail(UNUSED_SEND.format(timeout=timeout, context=backward.context.id,
                                                 waiting=", ".join(waiting) or "a source"))
            continue
        if item is not None:
            backward.run_ready()  # a send function got its gradients: run it here
    backward.future.wait()


def join_or_start(context: DistAutogradContext, retain_graph: bool, agent) -> tuple[BackwardPass, bool]:
    """The pass a propagate request joins on this worker; True if the request starts it."""
    with context.lock:
        if context.released:
            raise RuntimeError(CONTEXT_GONE)
        if context.backward is not None:
            return context.backward, False
        backward = context.backward = BackwardPass(context, [], retain_graph, agent)
        return backward, True
