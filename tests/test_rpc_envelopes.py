"""Contract: the reference agent's envelope interface (backends/reference/rpc/envelope.py) is the only seam
between the agent and what travels around a call: a layer of a third party's, given to ``Agent(envelopes=)``
next to the standard ones, sees every call's request, runs the callee side and gets its reply back, and the
agent core names no layer."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from backends.reference.rpc import ReferenceRpcBackendOptions, api, layers
from backends.reference.rpc.agent import Agent
from backends.reference.rpc.envelope import Envelope, OutgoingRequest
from backends.reference.rpc.tp_transport import TpTransport

pytestmark = pytest.mark.timeout(120)

AGENT_PY = Path(__file__).resolve().parent.parent / "backends" / "reference" / "rpc" / "agent.py"


class Stamp(Envelope):
    """Adds a serial number to every call that carries fields; the callee answers with it doubled."""

    name = "stamp"

    def __init__(self):
        self.sent = 0
        self.replies: list = []
        self.seen_on_callee: list = []

    def wrap_request(self, agent, request: OutgoingRequest) -> None:
        if not request.carries_fields:
            return
        self.sent += 1
        request.add_fields(self.name, self.sent)
        request.keep(self.name, self.sent)

    def run(self, agent, fields, run, reply: dict):
        self.seen_on_callee.append(fields)
        reply[self.name] = fields * 2
        return run()

    def unwrap_response(self, agent, state, fields) -> None:
        self.replies.append((state, fields))


def _start_pair(stamps):
    store = dist.HashStore()
    agents = [Agent(f"worker{r}", r, 2, ReferenceRpcBackendOptions(store=store, rpc_timeout=30), store,
                    TpTransport(connect_timeout=10.0), envelopes=(*layers.standard(), stamps[r]))
              for r in range(2)]
    errors: list = []
    threads = [threading.Thread(target=lambda a=a: _start(a, errors)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return agents


def _start(agent, errors) -> None:
    try:
        agent.start()
    except Exception as exc:  # reported by the caller
        errors.append(exc)


def test_a_third_layer_wraps_every_call_and_gets_its_reply():
    stamps = [Stamp(), Stamp()]
    agents = _start_pair(stamps)
    try:
        kind, key, target, async_exec = api._target_of(torch.add)
        for n in range(3):
            fut = agents[0].call(1, kind, key, target, (torch.ones(2), n), {}, async_exec, -1.0)
            assert torch.equal(fut.wait(), torch.ones(2) + n)
        assert stamps[1].seen_on_callee == [1, 2, 3]  # the callee's layer ran each request
        assert stamps[0].replies == [(1, 2), (2, 4), (3, 6)]  # and the caller's got each reply field back
        assert stamps[1].replies == [] and stamps[0].seen_on_callee == []
    finally:
        for agent in agents:
            agent.shutdown(graceful=False)


def test_the_agent_core_names_no_layer():
    """agent.py imports the layer list (layers.py) and the interface, never autograd or profiling."""
    tree = ast.parse(AGENT_PY.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert not {name for name in imported if "autograd" in name or "profiling" in name}, imported
