"""Remote profiling envelope for the reference agents (issue 5 fills this in).

The agent core calls exactly these four functions; while profiling is off
``begin_call`` returns None and nothing else is called, so an unprofiled RPC
costs one cheap check.

Caller side (in the user's thread, then in the response path)::

    call = profiling.begin_call(mode, func, src_name, dst_name)   # None: profiler off
    header["profiling"] = profiling.request_fields(call)          # only if call is not None
    user_future = profiling.wrap_future(call, user_future)        # ends the RPC record when done
    ... when the response (or error) for that request arrives, before completing the future:
    profiling.absorb_response(call, response_events_or_None)

Callee side (in the worker that runs a request whose header has "profiling")::

    fut = profiling.run_profiled(fields, run)   # run() -> torch.futures.Future of the result
    # fut completes with (result, events); the response header carries events
"""

from __future__ import annotations


def begin_call(mode, func, src_name, dst_name):
    return None


def request_fields(call) -> dict:
    raise NotImplementedError("remote profiling envelope not implemented yet")


def wrap_future(call, future):
    return future


def absorb_response(call, events) -> None:
    return None


def run_profiled(fields: dict, run):
    raise NotImplementedError("remote profiling envelope not implemented yet")
