"""Reference agents in one process, with the test itself as a third rank over raw sockets.

Used by tests/test_reference_rpc.py and tests/test_reference_autograd.py to
feed a live agent frames no honest agent would send. Ranks 0 and 1 are real
``Agent``\\ s on reference-tp sharing a HashStore; rank 2 is the test: it dials
both agents with a valid hello (so their start() completes) and keeps the
sockets, through which it can send anything.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from backends.reference.rpc import ReferenceRpcBackendOptions, api, device_maps, tp_codec
from backends.reference.rpc.agent import Agent
from backends.reference.rpc.tp_transport import TpTransport

START_JOIN_S = 15.0  # both agents start once rank 2 has dialled them


@dataclass
class InProcessAgents:
    """Two live agents (ranks 0 and 1) and the test's sockets to them (``fake[r]``: rank 2 -> rank r)."""

    agents: list[Agent]
    fake: list[socket.socket]

    def call(self, src: int, dst: int, func: Callable, *args: Any):
        """Agent ``src`` calls ``func(*args)`` on rank ``dst`` the way rpc_async does: its future."""
        kind, key, target, async_exec = api._target_of(func)
        return self.agents[src].call(dst, kind, key, target, args, {}, async_exec, -1.0)


@contextmanager
def agents_with_fake_peer(dial_timeout: float = 5.0) -> Iterator[InProcessAgents]:
    """Start agents worker0 and worker1 of a 3-rank world; this test is worker2, dialling both honestly.

    Shuts the agents down ungracefully and closes the sockets on exit.
    """
    store = dist.HashStore()
    agents = [Agent(f"worker{r}", r, 3, ReferenceRpcBackendOptions(store=store, rpc_timeout=30), store,
                    TpTransport(connect_timeout=10.0)) for r in range(2)]
    errors: list[BaseException] = []

    def start(agent: Agent) -> None:
        try:
            agent.start()
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(agent,)) for agent in agents]
    for t in threads:
        t.start()
    # what a worker publishes at start: its devices and device maps (none), then its name
    store.set("agent/devices/2", device_maps.advertise("worker2", {}, []).encode())
    store.set("agent/name/2", "worker2")
    token = store.get("tp/token").decode()
    fake: list[socket.socket] = []
    try:
        for r in range(2):
            host, port = store.get(f"tp/addr/{r}").decode().rsplit(":", 1)
            fake.append(socket.create_connection((host, int(port)), timeout=dial_timeout))
            fake[-1].sendall(tp_codec.hello_bytes(tp_codec.HELLO, {"token": token, "rank": 2}))
        for t in threads:
            t.join(START_JOIN_S)
        assert not errors, errors
        yield InProcessAgents(agents, fake)
    finally:
        for sock in fake:
            sock.close()
        for agent in agents:
            agent.shutdown(graceful=False)
