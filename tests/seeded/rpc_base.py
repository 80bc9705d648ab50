"""Planting a bug in the reference RPC agent (backends/reference/rpc/agent.py) for the seeded-bug gallery.

An RPC bug module registers the clean gloo wrapper as its c10d backend (the
process groups are not what is under test) and replaces one method of the
reference ``Agent`` on import. Plugins are imported in pytest and in every
rank before anything starts, so every agent the suite starts carries the bug.
The gallery runs it with ``--rpc-agent reference-tp`` (``EXTRA_ARGS``).
"""

from __future__ import annotations

import functools
import inspect

from backends.reference.rpc import agent as agent_module
from tests.seeded.gloo_wrapper import GlooWrapper, register

Agent = agent_module.Agent
EXTRA_ARGS = ("--rpc-agent", "reference-tp")


class RpcBugHost(GlooWrapper):
    """gloo, delegated unchanged: the bug lives in the RPC agent."""


def plant(name: str, method: str, make_replacement) -> object:
    """Replace ``Agent.<method>`` by ``make_replacement(original)`` (once per process); return the backend spec."""
    original = getattr(Agent, method, None)
    if original is None:  # the core was refactored: say what to update instead of failing obscurely
        raise ImportError(f"{name}: backends.reference.rpc.agent.Agent has no method {method!r} any more; "
                          f"plant the bug in its successor (tests/seeded/{name}.py)")
    if not getattr(original, "__seeded_bug__", False):
        replacement = functools.wraps(original)(make_replacement(original))
        replacement.__seeded_bug__ = True
        setattr(Agent, method, replacement)
    return register(name, RpcBugHost)


def bind(original, self, args, kwargs) -> inspect.BoundArguments:
    """The call's arguments by parameter name, whatever mix of positions and keywords the core used."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    return bound
