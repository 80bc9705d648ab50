"""Seeded bug: the RPC's profiling key drops the spaces around "->" ("rpc_sync#aten::add(worker0->worker1)").

A hand-written key format instead of torch's _build_rpc_profiling_key. Caught
by the profiling suite's key clause and by parity with TensorPipe: every RPC
event and every remote event name differs.
"""

from tests.seeded.rpc_profiling_base import plant_in_profiling


def wrong_key(mode, func_name, src_name, dst_name):
    return f"rpc_{getattr(mode, 'value', mode)}#{func_name}({src_name}->{dst_name})"


DISTCONFORM_SPEC = plant_in_profiling("rpc_profiling_wrong_key", "rpc_profiling_key", lambda original: wrong_key,
                                      __doc__.strip().splitlines()[0])
