"""Where distributed autograd meets the agent: forward recording, its requests, clean-up, RRef.backward.

The agent (agent.py) reaches these five points through the autograd
envelope layer (envelope.py), and knows nothing else:

* ``wrap_request`` / ``wrap_response``: an RPC request (or a response to a
  request that came inside a context) is pickled here; when the sending
  thread is in a context it travels as FORWARD_AUTOGRAD_REQ/_RESP (torch's
  rule, utils.cpp getMessageWithAutograd: always for Python UDFs, TorchScript
  and RRef fetches, for builtins only when a tensor requires grad) and the
  tensors requiring grad get a send function;
* ``unwrap_request`` / ``unwrap_response``: the receiver gets or creates the
  context and records the recv function; a request's context becomes the
  current one of the thread that runs it (``forced_context``), so nested RPCs
  carry it too;
* ``serve``: BACKWARD_AUTOGRAD_REQ (propagate gradients),
  CLEANUP_AUTOGRAD_CONTEXT_REQ, RREF_BACKWARD_REQ. Each returns a Future of
  None or an error text; a malformed frame raises ProtocolError naming the
  sender (the agent answers with the error and keeps serving).
"""

from __future__ import annotations

import logging
import pickle
import threading
from contextlib import contextmanager

import torch

from backends.reference.codec import ProtocolError

from .. import current, serialize
from ..transport import Frame, Kind
from . import engine, messages
from .container import CONTAINER, UNKNOWN
from .functions import record_recv, record_send
from .requests import K_CLEANUP, K_FORWARD_REQ, K_FORWARD_RESP, K_PROPAGATE, K_RREF_BACKWARD, outcome_text

log = logging.getLogger(__name__)

SERVED = frozenset((K_PROPAGATE, K_CLEANUP, K_RREF_BACKWARD))
WRAPPABLE_REQUESTS = frozenset(int(k) for k in (Kind.SCRIPT_CALL, Kind.PYTHON_CALL, Kind.SCRIPT_REMOTE_CALL,
                                                Kind.PYTHON_REMOTE_CALL, Kind.PYTHON_RREF_FETCH_CALL))
WRAPPABLE_RESPONSES = frozenset(int(k) for k in (Kind.PYTHON_RET, Kind.PYTHON_RREF_FETCH_RET))
FORCED = frozenset(int(k) for k in (Kind.PYTHON_CALL, Kind.PYTHON_REMOTE_CALL, Kind.PYTHON_RREF_FETCH_CALL))
NAMES = {int(k): k.name for k in Kind}

# torch's clean-up retries (container.cpp sendReleaseContextRpc -> rpc_agent.cpp sendWithRetries defaults)
CLEANUP_RETRIES, CLEANUP_FIRST_RETRY_S, CLEANUP_BACKOFF = 20, 1.0, 1.5
# torch's texts (py_rref.cpp, rref_impl.cpp)
RREF_NOT_TENSOR = "RRef should contain a tensor for .backward()"
USER_RREF_NEEDS_CONTEXT = "User RRefs require 'dist_autograd_ctx_id' to be specified"


def current_context_id() -> int:
    return CONTAINER.current_id()


def _forced(kind: int, key) -> bool:
    """Carry the context even without tensors requiring grad (torch's forceGradRecording)?"""
    if kind in FORCED:
        return True
    if key is None:
        return True
    try:
        return pickle.loads(key)[0] != "builtin"  # TorchScript yes, builtin operators no
    except Exception:
        return True


# =================================================================== forward
def wrap_request(agent, dst: int, kind: int, key, payload) -> tuple[int, bytes, list]:
    """(kind, header, tensors) of a request sent by a thread that has a current context."""
    header, tensors, graded = serialize.dumps_graded(payload)
    context = CONTAINER.contexts.get(CONTAINER.current_id())
    if context is None or (not graded and not _forced(kind, key)):
        return kind, header, tensors
    return _wrap(agent, context, dst, kind, header, tensors, graded, K_FORWARD_REQ)


def wrap_response(agent, dst: int, context_id: int, kind: int, payload) -> tuple[int, bytes, list]:
    """A response to a request that came inside context ``context_id``: wrapped only if it carries grad."""
    header, tensors, graded = serialize.dumps_graded(payload)
    context = CONTAINER.contexts.get(context_id)
    if context is None or not graded or kind not in WRAPPABLE_RESPONSES:
        return kind, header, tensors
    return _wrap(agent, context, dst, kind, header, tensors, graded, K_FORWARD_RESP)


def _wrap(agent, context, dst, kind, header, tensors, graded, envelope):
    msg_id = CONTAINER.new_message_id()
    with context.lock:
        context.known.add(dst)
        if graded:
            context.send[msg_id] = record_send(msg_id, dst, [t for _, t in graded])
    indices = [i for i, _ in graded]
    return envelope, messages.encode_forward(kind, context.id, msg_id, agent.rank, indices, header), tensors


def _unwrap(src: int, frame: Frame, allowed) -> tuple[Frame, int]:
    meta, inner = messages.decode_forward(frame.header, len(frame.tensors), src, allowed)
    messages.check_grad_tensors(frame.tensors, meta.grad_indices)
    context = CONTAINER.get_or_create(meta.context_id)
    if meta.grad_indices:
        with context.lock:
            if meta.msg_id in context.recv:
                raise ProtocolError(f"autograd message id {meta.msg_id} of context {meta.context_id} "
                                    "arrived twice")
            context.recv[meta.msg_id] = record_recv(meta.msg_id, src, [frame.tensors[i] for i in meta.grad_indices])
    return Frame(meta.wrapped_kind, frame.msg_id, inner, frame.tensors), meta.context_id


def unwrap_request(agent, src: int, frame: Frame) -> tuple[Frame, int]:
    """(the wrapped request, its context id); the recv function is recorded."""
    return _unwrap(src, frame, WRAPPABLE_REQUESTS)


def unwrap_response(agent, src: int, frame: Frame) -> Frame:
    return _unwrap(src, frame, WRAPPABLE_RESPONSES)[0]


@contextmanager
def forced_context(context_id: int):
    """Run a request of context ``context_id`` with it as the thread's current context (restored after)."""
    previous = CONTAINER.current_id()
    CONTAINER.set_current_id(context_id)
    try:
        yield
    finally:
        CONTAINER.set_current_id(previous)


# =================================================================== requests we send
def _agent():
    return current.agent()


def release(context_id: int) -> None:
    """``_release_context``: forget the context here and tell every worker it reached (unawaited)."""
    context = CONTAINER.pop(context_id)
    if context is None:
        raise RuntimeError(UNKNOWN.format(context_id))
    _forget(context, exclude=())


def _forget(context, exclude) -> None:
    running = context.backward
    if running is not None:
        running.fail(engine.CONTEXT_GONE)
    try:
        agent = _agent()
    except RuntimeError:  # RPC already shut down: nobody to tell
        return
    for worker in sorted(context.known):
        if worker != agent.rank and worker not in exclude:
            _send_cleanup(agent, worker, context.id, 0)


def _send_cleanup(agent, worker: int, context_id: int, attempt: int) -> None:
    """One attempt of torch's sendWithRetries for a clean-up request (never awaited by user code)."""
    try:
        fut = agent.request(worker, K_CLEANUP, messages.encode_cleanup(context_id), [])
    except Exception as exc:
        _cleanup_failed(agent, worker, context_id, attempt, str(exc))
        return

    def answered(done):
        error = outcome_text(done)
        if error is not None:
            _cleanup_failed(agent, worker, context_id, attempt, error)

    fut.add_done_callback(answered)


def _cleanup_failed(agent, worker: int, context_id: int, attempt: int, error: str) -> None:
    if attempt >= CLEANUP_RETRIES or agent.stopped:
        log.warning("Could not release Dist Autograd Context on node %s: %s", worker, error)  # torch only logs
        return
    timer = threading.Timer(CLEANUP_FIRST_RETRY_S * CLEANUP_BACKOFF ** attempt, _send_cleanup,
                            args=(agent, worker, context_id, attempt + 1))
    timer.daemon = True
    timer.start()


# =================================================================== requests we serve
def _done(value=None):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def serve(agent, src: int, frame: Frame):
    """Answer an autograd request from ``src``: a Future of None or an error text.

    Raises ProtocolError (the agent answers with it, naming the sender) for a
    malformed frame.
    """
    kind = frame.kind
    if kind == K_PROPAGATE:
        context_id, msg_id, retain = messages.decode_propagate(frame.header, len(frame.tensors))
        return _serve_propagate(agent, src, context_id, msg_id, retain, frame.tensors)
    if kind == K_CLEANUP:
        context_id = messages.decode_cleanup(frame.header, len(frame.tensors))
        context = CONTAINER.pop(context_id)  # absent: a no-op (torch's releaseContextIfPresent)
        if context is not None:
            _forget(context, exclude=(src,))
        return _done()
    if kind == K_RREF_BACKWARD:
        rref_id, context_id, retain = messages.decode_rref_backward(frame.header, len(frame.tensors))
        return _serve_rref_backward(agent, rref_id, context_id, retain)
    raise ProtocolError(f"message kind {kind} is not an autograd request")


def _serve_propagate(agent, src, context_id, msg_id, retain, grads):
    context = CONTAINER.contexts.get(context_id)
    if context is None:
        return _done(UNKNOWN.format(context_id))
    send = context.send.get(msg_id)
    if send is None:
        return _done(engine.NO_SEND_FUNCTION.format(msg_id))
    if send.dst != src:
        raise ProtocolError(f"gradients for send function {msg_id} came from worker {src}, but that message "
                            f"went to worker {send.dst}")
    if len(grads) != len(send.shapes):
        raise ProtocolError(f"{len(grads)} gradients for send function {msg_id}, which sent {len(send.shapes)} "
                            "tensors requiring grad")
    for i, (grad, (shape, dtype)) in enumerate(zip(grads, send.shapes)):
        if tuple(grad.shape) != shape or grad.dtype != dtype:
            raise ProtocolError(f"gradient {i} for send function {msg_id} is {grad.dtype}{list(grad.shape)}, "
                                f"the sent tensor was {dtype}{list(shape)}")
    try:
        backward, first = engine.join_or_start(context, retain, agent)
        backward.deliver(msg_id, list(grads))
    except Exception as exc:
        return _done(str(exc))
    if not first:
        return _done()  # torch: a later request joins the running pass and is answered at once
    answer = torch.futures.Future()
    backward.future.add_done_callback(lambda done: answer.set_result(outcome_text(done)))
    return answer


def _serve_rref_backward(agent, rref_id, context_id, retain):
    entry = agent.rrefs.find(rref_id)
    if entry is None:
        return _done(f"RRef {rref_id} has no value on its owner {agent.info}")
    answer = torch.futures.Future()

    def run(value_future):
        try:
            value = value_future.wait()
            backward = owner_backward(value, context_id, retain, agent)
        except Exception as exc:
            answer.set_result(str(exc))
            return
        if backward is None:
            answer.set_result(None)
        else:
            backward.future.add_done_callback(lambda done: answer.set_result(outcome_text(done)))

    entry.value.add_done_callback(run)
    return answer


# =================================================================== RRef.backward
def _root_of(value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise RuntimeError(RREF_NOT_TENSOR)
    return value


def owner_backward(value, context_id: int, retain_graph: bool, agent):
    """torch's OwnerRRef backward: a local autograd pass (-1) or a distributed one (its pass, not awaited)."""
    root = _root_of(value)
    if context_id == -1:
        torch.autograd.backward([root], retain_graph=retain_graph)
        return None
    return engine.start_backward(context_id, [root], retain_graph, agent)


def rref_backward(rref, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
    """``RRef.backward`` (py_rref.cpp PyRRef::backward)."""
    agent = rref._agent
    if rref.is_owner():
        backward = owner_backward(rref.local_value(), dist_autograd_ctx_id, retain_graph, agent)
        if backward is not None:
            engine.wait(backward, agent.default_timeout)
        return
    if dist_autograd_ctx_id == -1:
        raise RuntimeError(USER_RREF_NEEDS_CONTEXT)
    if not 0 <= dist_autograd_ctx_id < 1 << 64:
        raise RuntimeError(UNKNOWN.format(dist_autograd_ctx_id))
    header = messages.encode_rref_backward(rref.rref_id, dist_autograd_ctx_id, retain_graph)
    error = outcome_text(_settled(agent.request(rref._owner_rank(), K_RREF_BACKWARD, header, [])))
    if error is not None:
        raise RuntimeError(error)


def _settled(fut):
    try:
        fut.wait()
    except Exception:
        pass
    return fut
