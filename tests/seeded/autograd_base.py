"""Planting a bug in the reference distributed autograd (backends/reference/rpc/autograd/) for the gallery.

As rpc_base.py does for the agent: the bug module registers the clean gloo
wrapper as its c10d backend and, on import (in pytest and in every rank),
replaces one attribute of a class or module of the reference autograd
package. The gallery runs it on ``--rpc-agent reference-tp`` (its record's ``options``, tests/seeded/registry.py)
and the dist_autograd clause file the module names.
"""

from __future__ import annotations

from tests.seeded.rpc_base import RpcBugHost, plant_in

__all__ = ["plant"]


def plant(name: str, owner, attribute: str, make_replacement) -> object:
    """Replace ``owner.<attribute>`` by ``make_replacement(original)`` (once per process); return the backend spec."""
    return plant_in(name, owner, attribute, make_replacement, RpcBugHost)
