"""Seeded bug: the callee ignores record_shapes from the envelope, so remote ops have no input shapes.

The envelope carries the caller's ProfilerConfig, but the callee profiles
with its defaults. Caught by the local-vs-remote shapes clause and by parity
with TensorPipe (remote events come back with shapes []).
"""

from backends.reference.rpc import profiling
from tests.seeded.rpc_profiling_base import EXTRA_ARGS, SUITE, spec  # noqa: F401

CONTRACT = "with record_shapes a remote op's input shapes equal the same op profiled locally"

_clean = profiling.callee_config


def callee_config_without_shapes(fields):
    _, profile_memory = _clean(fields)
    return False, profile_memory


profiling.callee_config = callee_config_without_shapes
DISTCONFORM_SPEC = spec("rpc_profiling_shapes_dropped", __doc__.strip().splitlines()[0])
