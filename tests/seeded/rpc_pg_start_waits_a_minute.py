"""Seeded bug: reference-pg's transport waits a fixed minute for its peers to announce themselves, whatever the
agent's RPC timeout.

The transport is made without the agent's RPC timeout (as it was before the fault clauses bounded its start): a rank
that starts once its peer has given up (a rank let go after a SIGSTOP, whose peer raised at its RPC timeout) waits
60 s for that peer's announcement. Caught by the fault clause holding init_rpc to the agent's RPC timeout, on
reference-pg under a frozen peer.
"""

from backends.reference.rpc import transports
from backends.reference.rpc.pg_transport import PgTransport
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _a_minute(original):
    def over_process_group(options):
        return PgTransport()  # BUG: the agent's RPC timeout never reaches the transport: its 60 s default bounds start
    return over_process_group


DISTCONFORM_SPEC = plant_in("rpc_pg_start_waits_a_minute", transports, "over_process_group", _a_minute, RpcBugHost)
