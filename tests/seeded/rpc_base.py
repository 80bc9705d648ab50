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
from collections.abc import Callable
from typing import Any

from backends.reference.rpc import agent as agent_module
from tests.seeded.gloo_wrapper import GlooWrapper, register

Agent = agent_module.Agent
EXTRA_ARGS = ("--rpc-agent", "reference-tp")


class RpcBugHost(GlooWrapper):
    """gloo, delegated unchanged: the bug lives in the RPC agent."""


def plant_in(name: str, owner: Any, attribute: str, make_replacement: Callable, host: type) -> object:
    """Replace ``owner.<attribute>`` by ``make_replacement(original)`` (once per process); return the spec of ``host``.

    ``owner`` is a class or a module of the reference RPC stack and the
    attribute must be its own (not inherited), so the bug lands where the
    core defines it. The agent, autograd and training bases all plant this way.
    """
    original = vars(owner).get(attribute)
    if original is None:  # the core was refactored: say what to update instead of failing obscurely
        where = owner.__name__ if inspect.ismodule(owner) else f"{owner.__module__}.{owner.__qualname__}"
        raise ImportError(f"{name}: {where} has no attribute {attribute!r} any more; "
                          f"plant the bug in its successor (tests/seeded/{name}.py)")
    if not getattr(original, "__seeded_bug__", False):
        replacement = functools.wraps(original)(make_replacement(original))
        replacement.__seeded_bug__ = True
        setattr(owner, attribute, replacement)
    return register(name, host)


def plant(name: str, method: str, make_replacement: Callable) -> object:
    """Replace ``Agent.<method>`` by ``make_replacement(original)`` (once per process); return the backend spec."""
    return plant_in(name, Agent, method, make_replacement, RpcBugHost)


def bind(original, self, args, kwargs) -> inspect.BoundArguments:
    """The call's arguments by parameter name, whatever mix of positions and keywords the core used."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    return bound
