"""Distributed autograd contexts of this process: ids, the thread's current context, release.

As torch's DistAutogradContainer (torch/csrc/distributed/autograd/context/
container.cpp): one container per process, bound to the worker id (= rank)
when the agent starts. A context id is ``(worker_id << 48) | counter`` with a
per-process counter shared by all threads; autograd *message* ids, which key
send and recv functions, are a second counter of the same layout. Each thread
has at most one current context (-1: none); any thread may look a context up
by id. Error texts are torch's (measured on 2.13, see
/work/shared/specs/dist-autograd.md A1-A11).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

MAX_WORKER_ID = 65535
ID_SHIFT = 48
COUNTER_MASK = (1 << ID_SHIFT) - 1

# torch's texts
NOT_INITIALIZED = "Need to initialize distributed autograd using torch.distributed.autograd.init()"
NO_CURRENT = ("Current thread doesn't have a valid autograd context. Please wrap your code using: "
              "`with torch.distributed.autograd.context() as context_id` to generate a valid context")
STALE_CURRENT = "Couldn't find autograd context data for current autograd context id"
ALREADY_HAVE = "Already have an autograd context id for this thread."
UNKNOWN = "Could not find autograd context with id: {}"


class DistAutogradContext:
    """One context on this worker: its send and recv functions, the workers it reached, leaf gradients.

    ``send`` / ``recv``: autograd message id -> record (functions.py). Send
    ids come from this worker's counter, recv ids from the sender's.
    ``grads``: leaf tensor (identity-hashed) -> accumulated gradient.
    ``backward``: the backward pass in progress on this worker (engine.py), or None.
    """

    def __init__(self, context_id: int):
        self.id = context_id
        self.lock = threading.RLock()
        self.send: dict[int, Any] = {}
        self.recv: dict[int, Any] = {}
        self.known: set[int] = set()
        self.grads: dict = {}
        self.backward: Any = None  # the running engine.BackwardPass (engine imports this module: typed Any)
        self.released = False

    # torch's introspection (autograd/init.cpp DistAutogradContext bindings)
    def _context_id(self) -> int:
        return self.id

    def _send_functions(self) -> dict:
        """{autograd message id: SendRpcBackward node}, ids ascending."""
        with self.lock:
            return {mid: self.send[mid].node for mid in sorted(self.send)}

    def _recv_functions(self) -> dict:
        """{autograd message id: RecvRpcBackward node}, ids ascending."""
        with self.lock:
            return {mid: self.recv[mid].node for mid in sorted(self.recv)}

    def _known_worker_ids(self) -> set:
        with self.lock:
            return set(self.known)

    def accumulate(self, leaf, grad) -> None:
        """Add ``grad`` into this context's gradient of ``leaf`` (torch's DistAutogradContext::accumulateGrad)."""
        grad = grad.detach()
        with self.lock:
            old = self.grads.get(leaf)
            if old is None:
                self.grads[leaf] = grad.clone()  # never an alias of a tensor the engine handed out
            elif old.is_sparse or grad.is_sparse or old.shape != grad.shape or old.dtype != grad.dtype:
                self.grads[leaf] = old + grad
            else:
                old.add_(grad)  # in place: get_gradients' tensors stay the same objects

    # what the reference DDP reducer reads and writes while this context's backward runs its hooks
    # (backends/reference/grad_context.py; torch's DistAutogradContext::runGradCallbackForVariable)
    def get_grad(self, variable):
        with self.lock:
            return self.grads.get(variable)

    def set_grad(self, variable, grad) -> None:
        with self.lock:
            self.grads[variable] = grad

    def __repr__(self) -> str:
        return f"DistAutogradContext(id={self.id})"


class Container:
    def __init__(self):
        self.worker_id: int | None = None
        self.lock = threading.Lock()
        self.contexts: dict[int, DistAutogradContext] = {}
        self._context_ids = itertools.count()
        self._message_ids = itertools.count()
        self.local = threading.local()

    # ------------------------------------------------------------ init
    def init(self, worker_id: int) -> None:
        """torch's ``_init(worker_id)``: the same id again is a no-op, another one an error."""
        if isinstance(worker_id, bool) or not isinstance(worker_id, int) or not 0 <= worker_id <= MAX_WORKER_ID:
            raise RuntimeError(f"worker_id needs to be in the range [0, {MAX_WORKER_ID}]")
        with self.lock:
            if self.worker_id is not None and self.worker_id != worker_id:
                raise RuntimeError(f"Container is already initialized with worker_id: {self.worker_id}, "
                                   f"cannot initialize with different worker_id: {worker_id}")
            self.worker_id = worker_id

    def bind(self, worker_id: int) -> None:
        """An agent starts as ``worker_id``: a process whose contexts are all gone may change rank."""
        with self.lock:
            if self.worker_id is not None and self.worker_id != worker_id and not self.contexts:
                self.worker_id = None
                self._context_ids = itertools.count()
                self._message_ids = itertools.count()
        self.init(worker_id)

    def _worker(self) -> int:
        worker = self.worker_id
        if worker is None:
            raise RuntimeError(NOT_INITIALIZED)
        return worker

    def max_id(self) -> int:
        return (self._worker() << ID_SHIFT) | COUNTER_MASK

    def _next(self, counter) -> int:
        worker = self._worker()
        value = next(counter)
        if value >= COUNTER_MASK:  # torch internal-asserts id < max_id
            raise RuntimeError(f"distributed autograd ids of worker {worker} are exhausted")
        return (worker << ID_SHIFT) | value

    def new_message_id(self) -> int:
        return self._next(self._message_ids)

    # ------------------------------------------------------ the thread's context
    def current_id(self) -> int:
        return getattr(self.local, "id", -1)

    def set_current_id(self, context_id: int) -> None:
        self.local.id = context_id

    def new_context(self) -> DistAutogradContext:
        if self.current_id() != -1:
            raise RuntimeError(ALREADY_HAVE)
        context = DistAutogradContext(self._next(self._context_ids))
        with self.lock:
            self.contexts[context.id] = context
        self.local.id = context.id
        return context

    def current(self) -> DistAutogradContext:
        self._worker()
        context_id = self.current_id()
        if context_id == -1:
            raise RuntimeError(NO_CURRENT)
        context = self.contexts.get(context_id)
        if context is None:
            raise RuntimeError(STALE_CURRENT)
        return context

    # ------------------------------------------------------------ by id
    def retrieve(self, context_id: int) -> DistAutogradContext:
        self._worker()
        context = self.contexts.get(context_id)
        if context is None:
            raise RuntimeError(UNKNOWN.format(context_id))
        return context

    def get_or_create(self, context_id: int) -> DistAutogradContext:
        """A context another worker created, first heard of in a message (torch's getOrCreateContext)."""
        with self.lock:
            context = self.contexts.get(context_id)
            if context is None:
                context = self.contexts[context_id] = DistAutogradContext(context_id)
            return context

    def pop(self, context_id: int) -> DistAutogradContext | None:
        """Erase a context (None if absent); clears the thread's id only if it is this context."""
        with self.lock:
            context = self.contexts.pop(context_id, None)
        if context is not None:
            with context.lock:
                context.released = True
        if self.current_id() == context_id:
            self.local.id = -1
        return context

    def count(self) -> int:
        with self.lock:
            return len(self.contexts)

    def all(self) -> list[DistAutogradContext]:
        with self.lock:
            return list(self.contexts.values())


CONTAINER = Container()
