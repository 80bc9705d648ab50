"""The reference backend's flight recorder: what torch's recorder holds, kept in Python.

torch 2.13 records flight-recorder entries from C++ only, so a Python process
group cannot write into torch's recorder (backends/flight_recorders.py). The
reference keeps the same information here and registers it there, which is how
the harness's hang reports and the flight-recorder clauses (``recorder="backend"``)
read it. Like torch's recorder:

* one per process, a ring of the last ``TORCH_FR_BUFFER_SIZE`` entries (0: off),
  its size read when the process makes its first reference group;
* one entry per collective and p2p call with torch's fields: ``record_id``
  counting every entry of the process, ``pg_id`` the group's creation number,
  ``process_group`` (name, description), ``collective_seq_id`` (the group's own
  collective number, the same on every rank for the same call; a p2p entry
  carries the group's last one), ``p2p_seq_id`` (the group's p2p calls),
  ``op_id`` (every call of the group), ``profiling_name`` ("reference:all_reduce",
  "reference:send 0->1", "reference:recv 1<-0" as torch's analyser parses p2p),
  sizes and dtypes as torch spells them ("Float"), the timeout;
* ``state`` "scheduled" when issued, "started" when the group's worker takes it
  (a p2p call at once), "completed" when its Work finished, marked before the
  Work's waiters wake, so an entry read after ``wait()`` returned is "completed";
  a Work that ended with an error (a timeout, a lost peer) is retired but never
  "completed", as torch's NCCL recorder leaves a collective whose end event
  never came, and is counted in pg_status's last completed collective, as
  torch's recorders count it (suites/faults/test_fault_flight_recorder.py);
* ``pg_config`` (every group's name, description and global ranks) and
  ``pg_status`` (each group's last enqueued, started and completed collective).

Recording is a small object and a deque append per call, and never fails the
call: an error while recording is counted and shown in the dump instead. The
dumps' shape is torch's, from backends/flight_format.py (shared with native).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time

from backends import flight_format
from backends.flight_format import dtype_name
from backends.flight_recorders import RegisteredRecorder, recorder_size, register

PREFIX = "reference"


class RecordedGroup:
    """One process group as the recorder knows it: identity, and its counters and status."""

    __slots__ = ("pg_id", "name", "desc", "ranks", "p2p_seq", "op_id", "enqueued", "started", "completed")

    def __init__(self, pg_id: int, ranks: list[int]):
        self.pg_id, self.ranks = pg_id, ranks
        self.name, self.desc = "", "undefined"
        self.p2p_seq = self.op_id = 0
        self.enqueued = self.started = self.completed = -1  # collective_seq_id of the last one; -1: none


@dataclasses.dataclass(slots=True, eq=False)
class Entry:
    """One recorded call; ``state``, the times and ``retired`` change as its Work runs."""

    record_id: int
    group: RecordedGroup
    process_group: tuple[str, str]
    thread_name: str
    thread_id: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    time_created_ns: int
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    output_sizes: list[list[int]]
    output_dtypes: list[str]
    timeout_ms: int
    is_p2p: bool
    state: str = "scheduled"
    time_started_ns: int | None = None
    time_completed_ns: int | None = None
    retired: bool = False


def _sizes(tensors) -> tuple[list[list[int]], list[str]]:
    return [list(t.shape) for t in tensors], [dtype_name(t.dtype) for t in tensors]


class FlightRecorder:
    """The process's ring of entries and the groups they name."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: collections.deque[Entry] = collections.deque(maxlen=max(capacity, 0))
        self.groups: dict[str, RecordedGroup] = {}  # by name: the newest group of that name
        self.errors = 0  # recording errors swallowed so that the call went on
        self._record_ids = itertools.count()
        self._pg_ids = itertools.count()

    # ------------------------------------------------------------ recording
    def group(self, global_ranks: list[int]) -> RecordedGroup:
        return RecordedGroup(next(self._pg_ids), list(global_ranks))

    def named(self, group: RecordedGroup, name: str | None = None, desc: str | None = None) -> None:
        """torch gave ``group`` its name or description: pg_config and pg_status list it under that name."""
        if name is not None:
            group.name = name
        if desc is not None:
            group.desc = desc
        if group.name:
            self.groups[group.name] = group

    def record(self, group: RecordedGroup, name: str, seq: int, inputs, outputs, timeout_s: float,
               p2p: bool = False) -> Entry | None:
        """A call was issued: its entry ("scheduled"), or None when the recorder is off or failed."""
        if self.capacity <= 0:
            return None
        try:
            input_sizes, input_dtypes = _sizes(inputs)
            output_sizes, output_dtypes = _sizes(outputs)
            thread = threading.current_thread()
            group.op_id += 1
            if p2p:
                group.p2p_seq += 1
            else:
                group.enqueued = seq
            entry = Entry(record_id=next(self._record_ids), group=group, process_group=(group.name, group.desc),
                          thread_name=thread.name, thread_id=str(thread.ident),
                          collective_seq_id=max(group.enqueued, 0) if p2p else seq, p2p_seq_id=group.p2p_seq,
                          op_id=group.op_id, profiling_name=f"{PREFIX}:{name}", time_created_ns=time.time_ns(),
                          input_sizes=input_sizes, input_dtypes=input_dtypes, output_sizes=output_sizes,
                          output_dtypes=output_dtypes, timeout_ms=int(timeout_s * 1000), is_p2p=p2p)
            if self.groups.get(group.name) is not group and group.name:
                self.groups[group.name] = group
            self.entries.append(entry)
            return entry
        except Exception:  # noqa: BLE001 - the recorder must never fail the call it records
            self.errors += 1
            return None

    def started(self, entry: Entry | None) -> None:
        if entry is None:
            return
        try:
            entry.state = "started"
            entry.time_started_ns = time.time_ns()
            if not entry.is_p2p:
                entry.group.started = max(entry.group.started, entry.collective_seq_id)
        except Exception:  # noqa: BLE001 - see record()
            self.errors += 1

    def completed(self, entry: Entry | None) -> None:
        if entry is None:
            return
        try:
            now = time.time_ns()
            if entry.time_started_ns is None:
                entry.time_started_ns = now
            entry.time_completed_ns = now
            entry.state = "completed"
            entry.retired = True
            if not entry.is_p2p:
                group = entry.group
                group.started = max(group.started, entry.collective_seq_id)
                group.completed = max(group.completed, entry.collective_seq_id)
        except Exception:  # noqa: BLE001 - see record()
            self.errors += 1

    def failed(self, entry: Entry | None) -> None:
        """The call's Work ended with an error: retired, its state left as it was (it never completed), and counted in
        pg_status's last completed collective, as torch's recorders count it (ProcessGroupNCCL's watchdog: a Work with
        an exception isCompleted(), and sets lastCompletedSeq; gloo likewise)."""
        if entry is None:
            return
        try:
            entry.retired = True
            if not entry.is_p2p:
                entry.group.completed = max(entry.group.completed, entry.collective_seq_id)
        except Exception:  # noqa: BLE001 - see record()
            self.errors += 1

    # ------------------------------------------------------------- dumping
    def dump(self, pickled: bool) -> dict:
        """The recorder as torch's JSON dump (``pickled`` False) or its pickled dump, unpickled (True):
        backends/flight_format.py."""
        entries = list(self.entries)  # one C-level copy: safe while other threads append
        groups = [flight_format.Group(name, g.desc, g.ranks, g.enqueued, g.started, g.completed)
                  for name, g in dict(self.groups).items()]
        return flight_format.dump([{
            "record_id": e.record_id, "pg_id": e.group.pg_id, "process_group": e.process_group,
            "thread_name": e.thread_name, "thread_id": e.thread_id,
            "collective_seq_id": e.collective_seq_id, "p2p_seq_id": e.p2p_seq_id, "op_id": e.op_id,
            "profiling_name": e.profiling_name, "time_created_ns": e.time_created_ns,
            "input_sizes": e.input_sizes, "input_dtypes": e.input_dtypes,
            "output_sizes": e.output_sizes, "output_dtypes": e.output_dtypes, "state": e.state,
            "time_discovered_started_ns": e.time_started_ns, "time_discovered_completed_ns": e.time_completed_ns,
            "retired": e.retired, "timeout_ms": e.timeout_ms, "is_p2p": e.is_p2p,
        } for e in entries], groups, pickled, self.errors)


_RECORDER: FlightRecorder | None = None
_RECORDER_LOCK = threading.Lock()


def recorder() -> FlightRecorder:
    """The process's recorder, made (sized and registered) when the first reference group asks for it."""
    global _RECORDER
    if _RECORDER is None:
        with _RECORDER_LOCK:
            if _RECORDER is None:
                made = FlightRecorder(recorder_size())
                register(RegisteredRecorder(PREFIX, lambda: made.dump(pickled=False),
                                            lambda: made.dump(pickled=True)))
                _RECORDER = made
    return _RECORDER
