"""The reference RPC agents: torch.distributed.rpc's API in plain Python.

``import backends.reference.rpc as rpc`` and use it as torch.distributed.rpc::

    rpc.init_rpc("worker0", rank=0, world_size=2,
                 rpc_backend_options=rpc.ReferenceRpcBackendOptions(agent="reference-tp", store=store))
    rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))
    rpc.shutdown()

Two agents share the core (agent.py): ``reference-tp`` (direct sockets,
tp_transport.py) and ``reference-pg`` (frames over the c10d process group,
pg_transport.py); transports.py names the transports, and another agent
may bring its own (``ReferenceRpcBackendOptions(transport=...)``).
backends/rpc_agents.py lists the agents as data. What travels around a call
(autograd's context, profiling's events) is an envelope layer around the
core (envelope.py, layers.py); RRef bookkeeping is owners.py's.

``autograd/`` is torch.distributed.autograd for both (FAST mode: contexts,
send/recv functions recorded by every RPC made inside a context, the
distributed backward, ``get_gradients``, clean-up, ``RRef.backward``);
``import backends.reference.rpc.autograd as dist_autograd``.

Where they differ from torch.distributed.rpc, knowingly:

* no dynamic groups (``world_size`` is required);
* an RPC future fails through ``Future.set_exception`` (the original
  exception type and torch's text), which a Python agent can only store as a
  value: ``torch.futures.wait_all`` then raises the first failed future in
  list order, not the first to fail (gap ``wait_all_early_error``);
* a remote exception keeps its own class (TensorPipe turns a user-defined
  subclass into the nearest builtin type);
* ``RRef`` is this package's class, not ``torch.distributed.rpc.RRef``;
  ``WorkerInfo`` is torch's;
* RRef ids restart at 1 with each agent (TensorPipe's counter starts at 0 and
  keeps counting for the whole process, across ``init_rpc``);
* a function missing on the callee raises ``AttributeError`` on the caller
  (torch raises ``RuntimeError`` whose text starts "AttributeError: On
  WorkerInfo(...)"), and the "not initialized" texts are this package's own;
* a builtin that fails at run time carries the operator's own text, which
  differs in wording from torch's;
* a tensor arrives with storage offset 0 (torch keeps the sender's offset),
  and a call to self clones its arguments, so a small non-dense view sent to
  oneself arrives with packed strides;
* gradients of a distributed backward are always copied into the context
  (torch may reuse the buffer);
* device maps (``ReferenceRpcBackendOptions(device_maps=..., devices=...)``,
  TensorPipe's rules: device_maps.py) take any device type torch knows, where
  TensorPipe's options take CUDA devices only.

Every other behaviour is torch's, checked by suites/rpc, suites/dist_autograd
and suites/profiling on TensorPipe and both agents alike.
"""

from torch._C._distributed_rpc import WorkerInfo
from torch.distributed.rpc import functions

from .api import (UNSET_RPC_TIMEOUT, _set_rpc_timeout, get_rpc_timeout, get_worker_info, init_rpc, is_available,
                  remote, rpc_async, rpc_sync, shutdown)
from .options import ReferenceRpcBackendOptions
from .rref import RRef

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info", "get_rpc_timeout",
           "is_available", "functions", "RRef", "WorkerInfo", "ReferenceRpcBackendOptions", "UNSET_RPC_TIMEOUT",
           "_set_rpc_timeout"]
