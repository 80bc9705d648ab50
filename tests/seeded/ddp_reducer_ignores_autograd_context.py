"""Seeded bug: the reference DDP reducer never sees the distributed autograd context its hooks run in.

What the reference did before issue 33 and what torch's C++ reducer does
under a Python autograd engine: the reducer reads ``.grad`` (None inside a
context, so it all-reduces zeros) and writes the average into ``.grad``,
while the context keeps each rank's own, un-averaged gradient. Every
mechanism clause still passes (the AccumulateGrad post hook runs once per
backward); the context holds the wrong gradient for the user. Caught by the
DDP-inside-a-context clause of suites/dist_autograd/test_ddp.py.
"""

from __future__ import annotations

from backends.reference import grad_context
from tests.seeded.autograd_base import plant


def _no_context(original):
    def current() -> None:
        return None  # BUG: the engine's context of the running hooks is never read
    return current


DISTCONFORM_SPEC = plant("ddp_reducer_ignores_autograd_context", grad_context, "current", _no_context)
