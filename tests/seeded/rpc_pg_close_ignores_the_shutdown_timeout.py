"""Seeded bug: reference-pg's close waits its own 10 s for the peers' STOP frames, whatever the shutdown's timeout.

The transport drops what is left of a graceful shutdown's timeout (the transport as it was before the fault clauses
bounded its close): under a partition the agent raises at its timeout, then its transport waits SHUTDOWN_JOIN_S
(10 s) for STOP frames the partition never delivers. Caught by the fault clause holding graceful shutdown to its
timeout on reference-pg.
"""

from backends.reference.rpc.pg_transport import PgTransport
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _own_bound(original):
    def shutdown(self, within_s=None):
        return original(self)  # BUG: the shutdown's timeout is dropped: the transport's own 10 s bound it is
    return shutdown


DISTCONFORM_SPEC = plant_in("rpc_pg_close_ignores_the_shutdown_timeout", PgTransport, "shutdown", _own_bound,
                            RpcBugHost)
