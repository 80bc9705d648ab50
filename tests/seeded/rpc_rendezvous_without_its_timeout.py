"""Seeded bug: the agent's rendezvous runs under c10d's default timeout (30 minutes), not the agent's.

What torch's own init_rpc does: ``dist.rendezvous(init_method)`` without a timeout, the store given the RPC
timeout only once reached. A worker whose host cannot reach the store (the control plane cut off before the agents
start) keeps trying to connect for half an hour. Caught by the fault clause holding connecting to the agent's
timeout, under ``control_plane``.
"""

from datetime import timedelta

from backends.reference.rpc import api as api_module
from tests.seeded.rpc_base import RpcBugHost, plant_in

C10D_DEFAULT = timedelta(minutes=30)


def _without_timeout(original):
    def rendezvous(init_method, rank, world_size, timeout_s):
        return original(init_method, rank, world_size, C10D_DEFAULT.total_seconds())  # BUG: the agent's is dropped
    return rendezvous


DISTCONFORM_SPEC = plant_in("rpc_rendezvous_without_its_timeout", api_module, "rendezvous", _without_timeout,
                            RpcBugHost)
