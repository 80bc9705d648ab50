"""Seeded bug: the callee answers with the events recorded when the function returned, missing async work.

For an @async_execution function the events are collected as soon as it
returns its Future, not when the response is complete: the nested RPC, its
remote events and work in callbacks are lost. Caught at world size 3 by the
nested-RPC clauses and by parity with TensorPipe on the nested workload.
"""

from backends.reference.rpc import profiling
from tests.seeded.rpc_profiling_base import plant_in_profiling


def collect_at_return(fut, session, result, profiling_id):
    events = session.close()  # too early: async work has not happened yet
    fut.add_done_callback(lambda done: profiling._answer(done, session, result, profiling_id, events))


DISTCONFORM_SPEC = plant_in_profiling("rpc_profiling_async_missed", "collect_when_complete",
                                      lambda original: collect_at_return, __doc__.strip().splitlines()[0])
