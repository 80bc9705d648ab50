"""Making a call: torch.distributed.rpc's ``rpc_sync``, ``rpc_async`` and ``remote`` on the running agent.

Here rather than in api.py so that rref.py (whose proxies call the owner)
needs only this module and current.py: api.py imports agent.py, which
imports rref.py, and none of them imports api.py back.
"""

from __future__ import annotations

import pickle
import types

import torch
from torch.distributed.rpc.internal import RPCExecMode

from . import builtin_ops, current, profiling
from .transport import Kind

UNSET_RPC_TIMEOUT = -1.0  # torch's UNSET_RPC_TIMEOUT

K_SCRIPT_CALL, K_PYTHON_CALL = int(Kind.SCRIPT_CALL), int(Kind.PYTHON_CALL)
K_SCRIPT_REMOTE, K_PYTHON_REMOTE = int(Kind.SCRIPT_REMOTE_CALL), int(Kind.PYTHON_REMOTE_CALL)

_TARGETS: dict = {}  # function -> (kind, key, target, async_exec): the per-call decisions, made once
_CACHEABLE = (types.FunctionType, types.BuiltinFunctionType, torch.jit.ScriptFunction)


def target_of(func):
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
        builtin_ops.check_sendable(qualified_name)
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


def invoke(mode, to, func, args, kwargs, timeout, remote_owner: bool = False):
    """Send one call; its future. ``remote_owner``: a remote() call, the callee keeps the result and
    the future's ``rref`` is the caller's new user RRef to it."""
    agent = current.agent()
    kind, key, target, async_exec = target_of(func)
    if kind == K_SCRIPT_CALL:
        qualified_name = torch.jit._builtins._find_builtin(func)
        if qualified_name is not None:  # matched on the caller, as torch's caller does
            builtin_ops.check_arguments(qualified_name, args or (), kwargs or {})
    dst = agent.worker_info(to)
    call = profiling.begin_call(mode, func, agent.name, dst.name)
    if remote_owner:
        kind = K_SCRIPT_REMOTE if kind == K_SCRIPT_CALL else K_PYTHON_REMOTE
    with profiling.unrecorded():  # pickling and sending are the agent's work, not the user's events
        rref = agent.rrefs.new_user(dst.id) if remote_owner else None
        fut = agent.call(dst.id, kind, key, target, tuple(args) if args else (), kwargs if kwargs else {},
                         async_exec, float(timeout), call=call, rref=rref,
                         sync=mode is RPCExecMode.SYNC and call is None)
    if call is not None:
        fut = profiling.wrap_future(call, fut)
    return fut, rref


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result."""
    return invoke(RPCExecMode.SYNC, to, func, args, kwargs, timeout)[0].wait()


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Run ``func`` on worker ``to``; a torch.futures.Future of its result."""
    return invoke(RPCExecMode.ASYNC, to, func, args, kwargs, timeout)[0]


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Run ``func`` on worker ``to``, which keeps the result; an RRef to it."""
    fut, rref = invoke(RPCExecMode.REMOTE, to, func, args, kwargs, timeout, remote_owner=True)
    rref._created_by(fut)
    return rref
