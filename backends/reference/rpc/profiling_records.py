"""Profiler records as plain data, and torch's own parser run over them.

torch's legacy profiler hands out its records as C++ ``LegacyEvent`` objects
(push, pop, mark, memory_alloc), which Python can read but never create. A
reference agent has to move records between processes and add records that
did not come from the local profiler (a callee's events, the end of an RPC
that completed on another thread), so it keeps them as dicts:

    {"name", "kind", "handle", "node_id", "thread", "fwd_thread", "us" (absolute
     wall-clock microseconds, the profiler's own clock), "shapes", "stack",
     "scope", "seq", "async", "remote", "flops", "cpu_mem"}

``RecordView`` gives a dict the LegacyEvent methods that
``torch.autograd.profiler_legacy._parse_legacy_records`` calls, so torch's
parser (push/pop pairing, duplicate filtering, memory attribution, async
detection, FunctionEvent construction) turns them into the same
FunctionEvents it makes for TensorPipe's remote events. Nothing here
re-implements that parser.
"""

from __future__ import annotations

import time

START_MARK = "__start_profile"


def now_us() -> float:
    # The legacy profiler stamps records with the system clock in microseconds
    # (LegacyEvent.start_us); one host, one clock, so remote records need no offset.
    return time.time_ns() / 1000.0


def from_legacy(evt) -> dict:
    """A C++ LegacyEvent as a picklable record."""
    return {
        "name": evt.name(), "kind": evt.kind(), "handle": evt.handle(), "node_id": evt.node_id(),
        "thread": evt.thread_id(), "fwd_thread": evt.fwd_thread_id(), "us": evt.start_us(),
        "shapes": evt.shapes(), "stack": evt.stack(), "scope": evt.scope(), "seq": evt.sequence_nr(),
        "async": evt.is_async(), "remote": evt.is_remote(), "flops": evt.flops(),
        "cpu_mem": evt.cpu_memory_usage(),
    }


def from_legacy_lists(thread_records) -> list[list[dict]]:
    return [[from_legacy(evt) for evt in records] for records in thread_records]


def synthetic_range(name: str, *, node_id: int, thread: int, start_us: float, end_us: float,
                    handle: int) -> list[dict]:
    """A push/pop pair for a range the C++ profiler could not close itself (see profiling.py)."""
    base = {"handle": handle, "node_id": node_id, "thread": thread, "fwd_thread": 0, "shapes": [],
            "stack": [], "scope": 0, "seq": -1, "async": True, "remote": False, "flops": 0, "cpu_mem": 0}
    return [dict(base, name=name, kind="push", us=start_us), dict(base, name="", kind="pop", us=end_us)]


def start_mark(us: float) -> dict:
    return {"name": START_MARK, "kind": "mark", "handle": 0, "node_id": -1, "thread": 0, "fwd_thread": 0,
            "us": us, "shapes": [], "stack": [], "scope": 0, "seq": -1, "async": False, "remote": False,
            "flops": 0, "cpu_mem": 0}


class RecordView:
    """The LegacyEvent interface over a record dict (what _parse_legacy_records reads)."""

    __slots__ = ("r",)

    def __init__(self, record: dict):
        self.r = record

    def name(self):
        return self.r["name"]

    def kind(self):
        return self.r["kind"]

    def handle(self):
        return self.r["handle"]

    def node_id(self):
        return self.r["node_id"]

    def thread_id(self):
        return self.r["thread"]

    def fwd_thread_id(self):
        return self.r["fwd_thread"]

    def start_us(self):
        return self.r["us"]

    def cpu_elapsed_us(self, other):
        return other.r["us"] - self.r["us"]

    def shapes(self):
        return self.r["shapes"]

    def stack(self):
        return self.r["stack"]

    def scope(self):
        return self.r["scope"]

    def sequence_nr(self):
        return self.r["seq"]

    def is_async(self):
        return self.r["async"]

    def is_remote(self):
        return self.r["remote"]

    def flops(self):
        return self.r["flops"]

    def cpu_memory_usage(self):
        return self.r["cpu_mem"]

    def cuda_memory_usage(self):
        return 0

    def has_cuda(self):
        return False

    def device(self):
        return -1

    def cuda_elapsed_us(self, other):
        return 0.0


def parse(record_lists: list[list[dict]], start_us: float, parser) -> list:
    """FunctionEvents of ``record_lists`` timed from ``start_us`` (the local profile's start).

    ``parser`` is torch's ``_parse_legacy_records`` (the original, unwrapped).
    Each list is parsed as one thread's records, as torch does for the lists
    a C++ agent adds; a synthetic local start mark comes first so torch times
    every range from the user's own profile start.
    """
    if not record_lists:
        return []
    lists = [[RecordView(start_mark(start_us))]]
    lists += [[RecordView(r) for r in records] for records in record_lists]
    return parser(lists)
