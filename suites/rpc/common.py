"""Helpers shared by the RPC clauses: peers, outcomes that travel back to pytest, callee log capture."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from backends.rpc_agents import worker_name
from fixtures.rank import ctx


def peer(offset: int = 1) -> int:
    return (ctx.rank + offset) % ctx.world_size


def peer_name(offset: int = 1) -> str:
    return worker_name(peer(offset))


@dataclass
class Outcome:
    """What one call did, in a form that pickles back to pytest whatever the agent raised."""

    value: object = None
    error_type: str = ""
    error: str = ""
    seconds: float = 0.0

    @property
    def raised(self) -> bool:
        return bool(self.error_type)

    def describe(self) -> str:
        return f"raised {self.error_type}: {self.error}" if self.raised else f"returned {self.value!r}"


def outcome_of(call, *args, **kwargs) -> Outcome:
    start = time.perf_counter()
    try:
        value = call(*args, **kwargs)
    except Exception as exc:
        seconds = time.perf_counter() - start  # before str(exc): rendering a C++ error's backtrace takes time
        return Outcome(error_type=type(exc).__name__, error=str(exc), seconds=seconds)
    return Outcome(value=value, seconds=time.perf_counter() - start)


def barrier(tag: str, timeout_s: float = 20.0) -> None:
    """Every rank reached ``tag`` (through the case store; never the RPC agent under test)."""
    ctx.store.add(f"barrier/{tag}", 1)
    end = time.monotonic() + timeout_s
    while int(ctx.store.add(f"barrier/{tag}", 0)) < ctx.world_size:
        if time.monotonic() > end:
            raise TimeoutError(f"barrier {tag!r}: not every rank arrived within {timeout_s} s")
        time.sleep(0.002)


class _Tee(io.TextIOBase):
    def __init__(self, inner, sink):
        self.inner, self.sink = inner, sink

    def write(self, text):
        self.sink.append(text)
        return self.inner.write(text)

    def flush(self):
        self.inner.flush()


class _ListHandler(logging.Handler):
    def __init__(self, sink):
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record):
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.sink.append(text)


_capture_lock = threading.Lock()


@contextmanager
def callee_log():
    """Everything this rank writes to Python's stderr or logs while the block runs, as one list of strings.

    Agents report a UDF's exception on the callee either way (TensorPipe
    prints it to stderr; an agent may use logging), so both are captured.
    """
    sink: list[str] = []
    handler = _ListHandler(sink)
    root = logging.getLogger()
    with _capture_lock:
        saved = sys.stderr
        sys.stderr = _Tee(saved, sink)
        root.addHandler(handler)
        try:
            yield sink
        finally:
            root.removeHandler(handler)
            sys.stderr = saved
