"""torch.distributed.rpc's API, same signatures, answered by a reference agent.

Error types and texts are torch's where torch has them (each is marked with
where it was copied from), so a test written against torch.distributed.rpc
runs unchanged here.
"""

from __future__ import annotations

import pickle
import threading
import types
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_rpc import WorkerInfo
from torch.distributed.rpc import BackendType, functions  # noqa: F401  (functions re-exported: rpc.functions.async_execution)
from torch.distributed.rpc.internal import RPCExecMode

from . import profiling
from .agent import Agent, K_PYTHON_CALL, K_PYTHON_REMOTE, K_SCRIPT_CALL, K_SCRIPT_REMOTE
from .options import ReferenceRpcBackendOptions
from .rref import UNSET, RRef

UNSET_RPC_TIMEOUT = UNSET
# torch/distributed/rpc/api.py _require_initialized
NOT_INITIALIZED = "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first."

_agent: Agent | None = None
_init_lock = threading.Lock()
_init_counter = 0
_rendezvous = None  # kept alive as torch does (the store must outlive the handshake)


def is_available() -> bool:
    return True


def _current_agent() -> Agent:
    agent = _agent
    if agent is None or agent.stopped:
        raise RuntimeError(NOT_INITIALIZED)
    return agent


def _make_transport(options: ReferenceRpcBackendOptions):
    if options.agent == "reference-pg":
        from .pg_transport import PgTransport

        transport = PgTransport()
    else:
        from .tp_transport import TpTransport

        transport = TpTransport(listen_host=options.listen_host)
    if options.faults is not None:
        from .faulty import FaultyTransport

        transport = FaultyTransport(transport, options.faults)
    return transport


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """Start this worker's reference agent; returns when every worker of the world has started."""
    global _agent, _init_counter, _rendezvous
    if backend is not None and not isinstance(backend, BackendType):
        raise TypeError("Argument backend must be a member of BackendType")  # torch's text; the options choose
    if rpc_backend_options is None:
        raise TypeError("reference RPC needs rpc_backend_options=ReferenceRpcBackendOptions(...)")
    if not isinstance(rpc_backend_options, ReferenceRpcBackendOptions):
        # torch's text (rpc/__init__.py init_rpc), naming our options class
        raise TypeError("Argument rpc_backend_options must be an instance of ReferenceRpcBackendOptions")
    if not isinstance(name, str):
        raise RuntimeError(f"Argument {name} must be of type {str} but got type {type(name)}")
    WorkerInfo(name, 0)  # torch's name check and text ("Worker name must match ^[A-Za-z0-9-_:]*$, ...")
    if world_size is None:
        raise ValueError("reference RPC agents need world_size (dynamic groups are not supported)")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    options = rpc_backend_options
    with _init_lock:
        if _agent is not None and not _agent.stopped:
            raise RuntimeError("RPC is already initialized")  # torch's text (_init_rpc_backend)
        store = options.store
        if store is None:
            _rendezvous = dist.rendezvous(options.init_method or "env://", rank=rank, world_size=world_size)
            store, _, _ = next(_rendezvous)
            store.set_timeout(timedelta(seconds=options.rpc_timeout or 300))
            # torch's rule: a PrefixStore per init, so re-inits in one process never collide
            store = dist.PrefixStore(f"reference_rpc_{_init_counter}", store)
            _init_counter += 1
        profiling.set_node_id(rank)  # torch's _set_profiler_node_id(rank), as torch's init_rpc
        agent = Agent(name, rank, world_size, options, store, _make_transport(options))
        # current before it starts (as torch's _set_and_start_rpc_agent): a peer that
        # started first may already be calling, and its functions use this API
        _agent = agent
        try:
            agent.start()
        except BaseException:
            _agent = None
            agent._stop()
            raise


def shutdown(graceful=True, timeout=0):
    """Stop the agent; graceful: first wait until no worker has outstanding work (torch's semantics)."""
    global _agent
    agent = _current_agent()
    try:
        agent.shutdown(graceful=graceful, timeout=timeout)
    finally:
        _agent = None


def get_worker_info(worker_name=None):
    agent = _current_agent()
    if worker_name is None:
        return agent.info
    return agent.worker_info(worker_name)


def get_rpc_timeout() -> float:
    return _current_agent().default_timeout


def _set_rpc_timeout(rpc_timeout: float) -> None:
    _current_agent().default_timeout = float(rpc_timeout)


_TARGETS: dict = {}  # function -> (kind, key, target, async_exec): the per-call decisions, made once
_CACHEABLE = (types.FunctionType, types.BuiltinFunctionType, torch.jit.ScriptFunction)


def _target_of(func):
    """(message kind, key, target, is_async_exec) for a callable, decided as torch's _invoke_rpc does.

    Module-level functions, torch builtins and TorchScript functions travel as
    ``key``: their pickle (by qualified name), made once and resolved once per
    process on the callee. Anything else (a bound method, a callable object)
    travels as ``target`` inside the message's pickle, tensors and all.
    """
    try:
        return _TARGETS[func]
    except (KeyError, TypeError):  # TypeError: an unhashable callable
        pass
    if not callable(func):
        raise TypeError("function should be callable.")  # torch's text (api._invoke_rpc)
    original = func
    async_exec = hasattr(func, "_wrapped_async_rpc_function")
    if async_exec:
        wrapped = func._wrapped_async_rpc_function
        if isinstance(wrapped, torch.jit.ScriptFunction):
            func = wrapped
    qualified_name = torch.jit._builtins._find_builtin(func)
    if qualified_name is not None:
        decided = (K_SCRIPT_CALL, pickle.dumps(("builtin", qualified_name), 5), None, async_exec)
    elif isinstance(func, torch.jit.ScriptFunction):
        decided = (K_SCRIPT_CALL, pickle.dumps(("script", torch._jit_internal._qualified_name(func)), 5), None,
                   async_exec)
    elif isinstance(func, types.FunctionType) and "<locals>" not in func.__qualname__ \
            and "<lambda>" not in func.__qualname__:
        decided = (K_PYTHON_CALL, pickle.dumps(func, 5), None, async_exec)
    else:
        return (K_PYTHON_CALL, None, func, async_exec)
    if isinstance(original, _CACHEABLE) and len(_TARGETS) < 100_000:
        _TARGETS[original] = decided
    return decided


def _invoke(mode, to, func, args, kwargs, timeout, rref=None):
    agent = _current_agent()
    kind, key, target, async_exec = _target_of(func)
    dst = agent.worker_info(to)
    call = profiling.begin_call(mode, func, agent.name, dst.name)
    if rref is not None:
        kind = K_SCRIPT_REMOTE if kind == K_SCRIPT_CALL else K_PYTHON_REMOTE
    with profiling.unrecorded():  # pickling and sending are the agent's work, not the user's events
        fut = agent.call(dst.id, kind, key, target, tuple(args) if args else (), kwargs if kwargs else {},
                         async_exec, float(timeout), call=call, rref=rref(agent, dst.id) if rref is not None else None,
                         sync=mode is RPCExecMode.SYNC and call is None)
    if call is not None:
        fut = profiling.wrap_future(call, fut)
    return fut


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result."""
    return _invoke(RPCExecMode.SYNC, to, func, args, kwargs, timeout).wait()


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Run ``func`` on worker ``to``; a torch.futures.Future of its result."""
    return _invoke(RPCExecMode.ASYNC, to, func, args, kwargs, timeout)


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Run ``func`` on worker ``to``, which keeps the result; an RRef to it."""
    made = []

    def new_rref(agent, owner):
        rref = RRef._make(agent, agent.rrefs.new_id(), agent.rrefs.new_id(), owner, confirmed=False)
        made.append(rref)
        return rref

    fut = _invoke(RPCExecMode.REMOTE, to, func, args, kwargs, timeout, rref=new_rref)
    rref = made[0]
    rref._creation = fut
    return rref
