"""Seeded bug: the reference-tp agent connects with a fixed minute instead of the agent's RPC timeout.

``TpTransport.start`` dials and waits for its peers for ``CONNECT_TIMEOUT_S`` (60 s) whatever ``rpc_timeout``
the agent was given (a plausible slip: the transport's default wins over the option). Under a partition in place
before ``init_rpc``, start then blocks far past the agent's 2 s timeout. Caught by the fault clause holding
connecting to the agent's timeout.
"""

from backends.reference.rpc import tp_transport
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _fixed_minute(original):
    def start(self, *args, **kwargs):
        self.connect_timeout = tp_transport.CONNECT_TIMEOUT_S  # BUG: the agent's rpc_timeout is ignored
        return original(self, *args, **kwargs)
    return start


DISTCONFORM_SPEC = plant_in("rpc_connect_ignores_its_timeout", tp_transport.TpTransport, "start", _fixed_minute,
                            RpcBugHost)
