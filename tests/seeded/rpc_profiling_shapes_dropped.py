"""Seeded bug: the callee ignores record_shapes from the envelope, so remote ops have no input shapes.

The envelope carries the caller's ProfilerConfig, but the callee profiles
with its defaults. Caught by the local-vs-remote shapes clause and by parity
with TensorPipe (remote events come back with shapes []).
"""

from tests.seeded.rpc_profiling_base import plant_in_profiling


def _without_shapes(clean):
    def callee_config_without_shapes(fields):
        _, profile_memory = clean(fields)
        return False, profile_memory  # BUG: record_shapes is dropped
    return callee_config_without_shapes


DISTCONFORM_SPEC = plant_in_profiling("rpc_profiling_shapes_dropped", "callee_config", _without_shapes,
                                      __doc__.strip().splitlines()[0])
