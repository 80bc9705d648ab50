"""The reference agents' transports by the name an agent spec gives them (``AgentSpec.transport``).

Each factory takes the agent's ``ReferenceRpcBackendOptions`` and returns a
fresh Transport (transport.py); ``make`` resolves a "module:factory" name,
so a plugin's agent may bring a transport of its own.
"""

from __future__ import annotations

import importlib

from .. import handshake
from .pg_transport import PgTransport
from .tp_transport import TpTransport
from .transport import Transport


def over_sockets(options) -> Transport:
    """reference-tp: a direct socket per peer, connected within the agent's RPC timeout (none: the transport's
    default), as TensorPipe's init_rpc bounds its first round of calls by it."""
    listen_host = options.listen_host or handshake.listen_host("TP_SOCKET_IFNAME")
    if options.rpc_timeout and options.rpc_timeout > 0:
        return TpTransport(listen_host=listen_host, connect_timeout=float(options.rpc_timeout))
    return TpTransport(listen_host=listen_host)


def over_process_group(options) -> Transport:
    """reference-pg: frames over the default c10d process group; its ranks announce themselves within the agent's RPC
    timeout (none: the transport's default), as reference-tp connects within it. A rank that waited a fixed minute
    for peers that had given up at their timeout outlived them by that minute (measured: a rank let go after a
    SIGSTOP started once its peer had raised 'Timeout waiting for key ... after 2000 ms', and never returned within
    7 s)."""
    if options.rpc_timeout and options.rpc_timeout > 0:
        return PgTransport(start_timeout=float(options.rpc_timeout))
    return PgTransport()


def make(name: str, options) -> Transport:
    """The transport ``name`` ("module:factory") builds from ``options``."""
    module_name, _, attribute = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"reference RPC transport {name!r} cannot be found: {exc}") from exc
    return factory(options)
