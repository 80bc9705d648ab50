"""The reference RPC agents: torch.distributed.rpc's API in plain Python.

``import backends.reference.rpc as rpc`` and use it as torch.distributed.rpc::

    rpc.init_rpc("worker0", rank=0, world_size=2,
                 rpc_backend_options=rpc.ReferenceRpcBackendOptions(agent="reference-tp", store=store))
    rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))
    rpc.shutdown()

Two agents share the core (agent.py): ``reference-tp`` (direct sockets,
tp_transport.py) and ``reference-pg`` (frames over the c10d process group,
pg_transport.py). backends/rpc_agents.py lists them as data.
"""

from torch._C._distributed_rpc import WorkerInfo
from torch.distributed.rpc import functions

from .api import (UNSET_RPC_TIMEOUT, get_rpc_timeout, get_worker_info, init_rpc, is_available, remote, rpc_async,
                  rpc_sync, shutdown)
from .options import ReferenceRpcBackendOptions
from .rref import RRef

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info", "get_rpc_timeout",
           "is_available", "functions", "RRef", "WorkerInfo", "ReferenceRpcBackendOptions", "UNSET_RPC_TIMEOUT"]
