"""Seeded bug: graceful shutdown trusts the store to bound its own waits.

The reference agent's shutdown exchanges the workers' message counts over the store and gives the exchange up at
its deadline (``agent._within``), because torch's TCPStore client never gives up a request its server never got.
With that bound dropped, a worker whose host lost the store (the control plane cut off) waits in the store for
ever. Caught by the fault clause holding graceful shutdown to its timeout, under ``control_plane``.
"""

from backends.reference.rpc import agent as agent_module
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _unbounded(original):
    def within(deadline, why, call):
        return call()  # BUG: the store's call is waited for as long as it takes
    return within


DISTCONFORM_SPEC = plant_in("rpc_store_shutdown_unbounded", agent_module, "_within", _unbounded, RpcBugHost)
