"""How remote events reach the user's ``torch.autograd.profiler_legacy.profile``.

torch adds a callee's events in C++: the caller deserialises them into
LegacyEvents and appends them to its thread-local profiler state
(``addEventList`` in rpc/utils.cpp), so ``_disable_profiler_legacy()``
returns them with the local ones. torch 2.13 has no Python binding that
accepts events (checked: torch._C._autograd, torch._C._profiler and
torch._C._distributed_rpc offer none, and LegacyEvent has no constructor),
so a Python agent cannot put its events where TensorPipe's go.

The least invasive equivalent: two wrappers on profiler_legacy, installed once.

* ``profile._start_trace`` opens a ``Session`` for the profiling thread and
  remembers the profile's record_shapes/profile_memory (the C++ config is not
  readable from Python, and the callee must get it).
* the module-level ``_parse_legacy_records``, which ``profile.__exit__`` calls
  with the records it just took from C++, parses them unchanged and then
  appends the FunctionEvents of the session's extra records (remote events,
  RPC ranges the C++ profiler could not close, events of callbacks that ran
  on other threads) parsed by the same function, and sorts as torch does.

So ``function_events``, ``key_averages()``, ``table()`` (with its Node ID
column) and ``export_chrome_trace()`` (remote tids " node_id:<n>,
thread_id:<t> ") all come from torch's own EventList over one list, exactly
as for TensorPipe. A profile whose RPCs all went through TensorPipe has an
empty session and is parsed as before.
"""

from __future__ import annotations

import threading
from typing import Callable

from torch.autograd import profiler_legacy

from . import profiling_records

_INSTALLED: dict[str, Callable] = {}  # torch's originals while the hook is installed
_LOCK = threading.Lock()
_OPEN: dict[int, object] = {}  # profiling thread ident -> its Session


def session_for_thread(ident: int):
    with _LOCK:
        return _OPEN.get(ident)


def open_session(ident: int, session) -> None:
    with _LOCK:
        _OPEN[ident] = session


def _take_session(ident: int):
    with _LOCK:
        return _OPEN.pop(ident, None)


def install(make_session) -> None:
    """Wrap profiler_legacy once; ``make_session(record_shapes, profile_memory)`` builds a Session."""
    with _LOCK:
        if _INSTALLED:
            return
        orig_start = profiler_legacy.profile._start_trace
        orig_parse = profiler_legacy._parse_legacy_records
        _INSTALLED.update(start=orig_start, parse=orig_parse)

    def _start_trace(self):
        open_session(threading.get_ident(), make_session(bool(self.record_shapes), bool(self.profile_memory)))
        return orig_start(self)

    def _parse_legacy_records(thread_records):
        functions = orig_parse(thread_records)
        session = _take_session(threading.get_ident())
        if session is None:
            return functions
        extra = session.close()
        if not extra:
            return functions
        start = next(r for records in thread_records for r in records
                     if r.name() == profiling_records.START_MARK)
        functions.extend(profiling_records.parse(extra, start.start_us(), orig_parse))
        functions.sort(key=lambda evt: [evt.time_range.start, -evt.time_range.end])  # torch's order
        return functions

    _start_trace.__wrapped__ = orig_start  # type: ignore[attr-defined]  # functools.wraps' convention
    _parse_legacy_records.__wrapped__ = orig_parse  # type: ignore[attr-defined]
    profiler_legacy.profile._start_trace = _start_trace
    profiler_legacy._parse_legacy_records = _parse_legacy_records
