"""Seeded bug: reference-pg completes futures on its only listener thread and never hands receiving on.

The monitor that makes a fresh thread the listener while a delivery blocks
is gone (the transport as it was before the leader/follower fix): a ``then``
callback that waits on another RPC blocks the very thread that would receive
that RPC's response, and the nested call times out. Caught by the futures
clause on reference-pg.
"""

from backends.reference.rpc.pg_transport import PgTransport
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _never_hand_over(original):
    def monitor(self):
        return  # BUG: the listener delivers every frame itself, however long a delivery blocks
    return monitor


DISTCONFORM_SPEC = plant_in("rpc_pg_callback_blocks_listener", PgTransport, "_monitor", _never_hand_over, RpcBugHost)
