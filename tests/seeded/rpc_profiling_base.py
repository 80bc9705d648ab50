"""Shared by the seeded remote-profiling bugs (tests/seeded/rpc_profiling_*.py).

Each bug monkeypatches one piece of backends/reference/rpc/profiling.py on
import (the module is imported in pytest and in every rank, so the patch is
live wherever the reference agent runs) and registers the clean gloo wrapper
as its backend, so only the profiling envelope is broken. The profiling
suite runs against reference-tp; its TensorPipe baseline is unaffected (the
patches touch the reference agent's envelope only).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register

SUITE = "suites/profiling/"
EXTRA_ARGS = ("--rpc-agent", "reference-tp")


def spec(name: str, doc: str):
    """The clean gloo wrapper registered as ``name`` (the bug lives in the RPC agent, not in c10d)."""
    cls = type(f"Clean_{name}", (GlooWrapper,), {"__doc__": doc})
    return register(name, cls)
