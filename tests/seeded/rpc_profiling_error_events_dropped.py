"""Seeded bug: a profiled Python function that raises answers with its error but without its events.

torch runs a Python UDF through internal._run_function, which turns its
exception into the request's value (RemoteException): the request did not
fail, so TensorPipe sends the callee's events back with it. An agent that
treats the exception as a failed request drops them (what the reference
agents did until they mirrored RemoteException). Caught by parity with
TensorPipe on the python_udf_raises workload.
"""

from tests.seeded.rpc_base import bind, plant


def _drop_events(original):
    def respond_error(self, *args, **kwargs):
        bound = bind(original, self, args, kwargs)
        bound.arguments["fields"] = None  # BUG: the error travels, the events (the profiling reply field) do not
        return original(*bound.args, **bound.kwargs)
    return respond_error


DISTCONFORM_SPEC = plant("rpc_profiling_error_events_dropped", "_respond_error", _drop_events)
