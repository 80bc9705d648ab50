"""Shared by the seeded remote-profiling bugs (tests/seeded/rpc_profiling_*.py).

Each bug replaces one piece of backends/reference/rpc/profiling.py on
import, live in its own backend's ranks (tests/seeded/planting.py) and registers the clean gloo wrapper
as its backend, so only the profiling envelope is broken. The profiling
suite runs against reference-tp; its TensorPipe baseline is unaffected (the
patches touch the reference agent's envelope only).
"""

from collections.abc import Callable

from backends.reference.rpc import profiling
from tests.seeded.gloo_wrapper import GlooWrapper, register
from tests.seeded.planting import plant


def spec(name: str, doc: str):
    """The clean gloo wrapper registered as ``name`` (the bug lives in the RPC agent, not in c10d)."""
    cls = type(f"Clean_{name}", (GlooWrapper,), {"__doc__": doc})
    return register(name, cls)


def plant_in_profiling(name: str, attribute: str, make_replacement: Callable, doc: str) -> object:
    """Plant ``make_replacement(original)`` as ``profiling.<attribute>`` in backend ``name``'s ranks; return its spec."""
    plant(name, profiling, attribute, make_replacement)
    return spec(name, doc)
