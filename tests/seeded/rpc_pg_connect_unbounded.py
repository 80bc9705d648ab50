"""Seeded bug: reference-pg makes its group under the listener's days-long timeout, on the caller's thread.

What the transport did before it bounded its connect: ``dist.new_group(backend, timeout=7 days)`` inside
init_rpc. gloo connects while the group is made and, behind a partition, its listening side waits with no
bound (pytorch/gloo#520): init_rpc never returns. Caught by the fault clause holding connecting to the agent's
timeout, under ``partition``.
"""

import torch.distributed as dist

from backends.reference.rpc import pg_transport
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _unbounded(original):
    def connect(self, backend):
        return dist.new_group(backend=backend, timeout=pg_transport.IDLE_TIMEOUT)  # BUG: no bound on the connect
    return connect


DISTCONFORM_SPEC = plant_in("rpc_pg_connect_unbounded", pg_transport.PgTransport, "_connect", _unbounded, RpcBugHost)
