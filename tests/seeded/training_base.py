"""Planting a bug in the reference RPC training stack (backends/reference/rpc/optim.py, nn.py).

Planted by rpc_base.plant_in, as the agent's bugs are: the c10d backend is
the clean gloo wrapper (the process groups are not what is under test), the
bug replaces one attribute of a training-stack class or module on import (in pytest and in every rank, before anything starts), and the
gallery runs the named clause file on ``reference-tp``.
"""

from __future__ import annotations

import importlib.util

from tests.seeded.gloo_wrapper import GlooWrapper
from tests.seeded.rpc_base import plant_in


class TrainingBugHost(GlooWrapper):
    """gloo, delegated unchanged: the bug lives in the RPC training stack."""


def needs_reference_autograd(name: str) -> None:
    """A bug only distributed autograd can show: refuse to run (and so to pass) without it."""
    if importlib.util.find_spec("backends.reference.rpc.autograd") is None:
        raise ImportError(f"{name}: the clause that catches this bug needs the reference agents' distributed "
                          "autograd (backends/reference/rpc/autograd.py), which this tree does not have")


def plant(name: str, owner, attribute: str, make_replacement) -> object:
    """Replace ``owner.<attribute>`` (a class or module of the training stack) by ``make_replacement(original)``
    (once per process); return the backend spec."""
    return plant_in(name, owner, attribute, make_replacement, TrainingBugHost)
