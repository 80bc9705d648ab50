"""Planting a bug in the reference RPC agent (backends/reference/rpc/agent.py) for the seeded-bug gallery.

An RPC bug module registers the clean gloo wrapper as its c10d backend (the
process groups are not what is under test) and replaces one method of the
reference ``Agent`` on import, live in that backend's ranks only (tests/seeded/planting.py):
every agent those ranks start carries the bug.
The gallery runs it with ``--rpc-agent reference-tp`` (its record's ``options``, tests/seeded/registry.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from backends.reference.rpc import agent as agent_module
from tests.seeded.gloo_wrapper import GlooWrapper, register
from tests.seeded.planting import plant as plant_for_backend

Agent = agent_module.Agent


class RpcBugHost(GlooWrapper):
    """gloo, delegated unchanged: the bug lives in the RPC agent."""


def plant_in(name: str, owner: Any, attribute: str, make_replacement: Callable, host: type) -> object:
    """Plant ``make_replacement(original)`` as ``owner.<attribute>`` in backend ``name``'s ranks; return the spec of ``host``.

    ``owner`` is a class or a module of the reference RPC stack and the
    attribute must be its own (not inherited), so the bug lands where the
    core defines it. The bug is live only in the ranks of backend ``name``
    (tests/seeded/planting.py), so bugs planted this way share gallery runs.
    The agent, autograd and training bases all plant this way.
    """
    plant_for_backend(name, owner, attribute, make_replacement)
    return register(name, host)


def plant(name: str, method: str, make_replacement: Callable) -> object:
    """Replace ``Agent.<method>`` by ``make_replacement(original)`` (once per process); return the backend spec."""
    return plant_in(name, Agent, method, make_replacement, RpcBugHost)


def bind(original, self, args, kwargs) -> inspect.BoundArguments:
    """The call's arguments by parameter name, whatever mix of positions and keywords the core used."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    return bound
