"""torch.distributed.rpc's API, same signatures, answered by a reference agent.

Error types and texts are torch's where torch has them (each is marked with
where it was copied from), so a test written against torch.distributed.rpc
runs unchanged here.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch.distributed as dist
from torch._C._distributed_rpc import WorkerInfo
from torch.distributed.rpc import BackendType, functions  # noqa: F401  (functions re-exported: rpc.functions.async_execution)

from . import current, profiling, transports
from .autograd.container import CONTAINER as autograd_container
from .agent import Agent
from .calls import UNSET_RPC_TIMEOUT, remote, rpc_async, rpc_sync  # noqa: F401  (the API: re-exported)
from .calls import target_of as _target_of  # noqa: F401
from .current import NOT_INITIALIZED  # noqa: F401
from .current import agent as _current_agent
from .faulty import FaultyTransport
from .options import ReferenceRpcBackendOptions

_init_lock = threading.Lock()
_init_counter = 0
_rendezvous = None  # kept alive as torch does (the store must outlive the handshake)


def is_available() -> bool:
    return True


def _make_transport(options: ReferenceRpcBackendOptions):
    assert options.transport is not None  # __post_init__ names the agent's default
    transport = transports.make(options.transport, options)
    if options.faults is not None:
        transport = FaultyTransport(transport, options.faults)
    return transport


def rendezvous(init_method: str, rank: int, world_size: int, timeout_s: float):
    """``init_method``'s rendezvous, its store reached within the agent's timeout (torch's init_rpc rendezvouses
    under c10d's default 30 minutes: an agent whose store is cut off waits that long to start)."""
    return dist.rendezvous(init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """Start this worker's reference agent; returns when every worker of the world has started."""
    global _init_counter, _rendezvous
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
        running = current.peek()
        if running is not None and not running.stopped:
            raise RuntimeError("RPC is already initialized")  # torch's text (_init_rpc_backend)
        store = options.store
        if store is None:
            _rendezvous = rendezvous(options.init_method or "env://", rank, world_size, options.rpc_timeout or 300)
            store, _, _ = next(_rendezvous)
            store.set_timeout(timedelta(seconds=options.rpc_timeout or 300))
            # torch's rule: a PrefixStore per init, so re-inits in one process never collide
            store = dist.PrefixStore(f"reference_rpc_{_init_counter}", store)
            _init_counter += 1
        profiling.set_node_id(rank)  # torch's _set_profiler_node_id(rank), as torch's init_rpc
        autograd_container.bind(rank)  # torch's init_rpc: dist_autograd._init(rank)
        agent = Agent(name, rank, world_size, options, store, _make_transport(options))
        # current before it starts (as torch's _set_and_start_rpc_agent): a peer that
        # started first may already be calling, and its functions use this API
        current.install(agent)
        try:
            agent.start()
        except BaseException:
            current.install(None)
            agent._stop()
            raise


def shutdown(graceful=True, timeout=0):
    """Stop the agent; graceful: first wait until no worker has outstanding work (torch's semantics)."""
    agent = _current_agent()
    try:
        agent.shutdown(graceful=graceful, timeout=timeout)
    finally:
        current.install(None)


def get_worker_info(worker_name=None):
    agent = _current_agent()
    if worker_name is None:
        return agent.info
    return agent.worker_info(worker_name)


def get_rpc_timeout() -> float:
    return _current_agent().default_timeout


def _set_rpc_timeout(rpc_timeout: float) -> None:
    """torch.distributed.rpc._set_rpc_timeout: the default timeout of later calls (in seconds; 0: none)."""
    if rpc_timeout < 0:
        raise ValueError(f"rpc_timeout must be >= 0 seconds, got {rpc_timeout}")
    _current_agent().default_timeout = float(rpc_timeout)
