"""The operations a fault scenario runs under a fault: one record per operation, the one home of what each waits for.

Like suites/faults/table.py for faults: a record says which plane the operation uses (the backend's own
connections, or the store's), who waits for bytes across the cut (every rank, the rank receiving from the
cut-off rank, or the cut-off rank alone), whether it moves the scenario's payload (so a cut after N bytes
reaches it) and the words that name it in an error. ``reached`` decides from the two tables' data alone which
ranks a fault reaches in an operation: those must raise within the timeout plus the slack, the others must
succeed exactly. The cut-off rank is the last one; the p2p peer is rank 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from suites.faults.table import Fault

WAITING = ("every", "receiver", "cut")  # who waits for bytes across the cut
PEER = 0  # the cut-off rank's p2p peer


@dataclass(frozen=True, kw_only=True)
class Operation:
    name: str
    doc: str  # what every rank does under the fault, one line
    plane: str  # "data": the backend's connections; "control": the store's
    waiting: str  # WAITING: every rank, the receiver of the cut rank's send (rank 0), or the cut rank alone
    moves_payload: bool  # it moves the scenario's payload (a cut after N bytes reaches it), else a few bytes
    names: str  # a regular expression of the words that name it in an error (and in a flight-recorder entry)
    # a collective the flight recorder numbers with its group's collective_seq_id (test_fault_flight_recorder.py
    # reads its entries while it waits under the fault and once it ended); p2p calls have p2p_seq_ids, the store none
    numbered: bool = False
    # elements of float32 it moves at least under a fault that breaks it (0: the scenario's payload): a send nobody
    # reads must never fit into the connection's buffers, or a send that ignores its deadline completes anyway
    least_payload_under_a_break: int = 0

    def __post_init__(self) -> None:
        if self.waiting not in WAITING or self.plane not in ("data", "control"):
            raise ValueError(f"operation {self.name}: waiting must be one of {', '.join(WAITING)} and plane data "
                             f"or control, not {self.waiting!r}, {self.plane!r}")

    def involved(self, world_size: int) -> list[int]:
        """The ranks that call it."""
        return [PEER, world_size - 1] if self.name == "p2p" else list(range(world_size))

    def waiters(self, world_size: int) -> list[int]:
        """The ranks that wait for bytes across the cut (the cut-off rank is the last)."""
        return {"every": list(range(world_size)), "receiver": [PEER], "cut": [world_size - 1]}[self.waiting]


OPERATIONS: Sequence[Operation] = (
    Operation(name="all_reduce", doc="all_reduce of the payload on a group of every rank", plane="data",
              waiting="every", moves_payload=True, names=r"all_?reduce", numbered=True,
              # 48 MiB: each peer's share (a third at 3 ranks, a quarter at 4) is more than a connection's buffers
              # hold (below), so a collective's send under the break waits on its deadline; isend returns at once
              # (test_isend_returns_at_once_under_the_fault), so the collective is where an unbounded send shows
              least_payload_under_a_break=12 * 1024 * 1024),
    Operation(name="barrier", doc="barrier on a group of every rank", plane="data", waiting="every",
              moves_payload=False, names=r"barrier", numbered=True),
    Operation(name="p2p", doc="the cut-off rank sends the payload to rank 0, which receives it", plane="data",
              waiting="receiver", moves_payload=True, names=r"\b(i?send|i?recv)\b",
              # 16 MiB: more than a TCP connection's buffers ever hold (4 MiB to send, 6 MiB to receive at most);
              # 256 KiB fitted a warm connection in some runs, and a seeded unbounded send then passed
              least_payload_under_a_break=4 * 1024 * 1024),
    Operation(name="store_get", doc="every rank gets a key it set before the fault, from the store on the switch "
              "(a client of its own whose timeout is the group's)", plane="control", waiting="cut",
              moves_payload=False, names=r"\bget\b|store|127\.77\.0\.254"),
)
BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}
NUMBERED: tuple[str, ...] = tuple(op.name for op in OPERATIONS if op.numbered)  # the ones whose recorder is read


def breaks(fault: Fault, operation: Operation) -> bool:
    """Whether ``fault`` cuts what ``operation`` waits for: a breaking fault on the operation's plane, with enough
    payload for a cut after N bytes, and not a frozen rank that only the cut rank itself would wait for."""
    if not fault.breaks or fault.plane not in ("both", operation.plane):
        return False
    if fault.min_payload and not operation.moves_payload:
        return False  # its connections never carry N bytes
    return not (fault.stops_the_rank and operation.waiting == "cut")  # the store is not on the frozen host


def reached(fault: Fault, operation: Operation, world_size: int) -> list[int]:
    """The ranks whose call the fault must end with an error: the waiters, when the fault breaks the operation, but
    a cut-off rank that still hears every peer in a collective (one_way: a barrier may rightly end for it, since
    every peer's arrival reached it; its call may end either way)."""
    if not breaks(fault, operation):
        return []
    cut = world_size - 1
    return [r for r in operation.waiters(world_size)
            if not (r == cut and fault.cut_rank_hears and operation.waiting == "every")]


def unreached(fault: Fault, operation: Operation, world_size: int) -> list[int]:
    """The ranks whose call must succeed, exact: every involved rank a fault does not reach, but the sender of a
    p2p whose receiver is cut (its send may end either way: its bytes may be buffered)."""
    if not breaks(fault, operation):
        return operation.involved(world_size)
    return [r for r in operation.involved(world_size) if r not in operation.waiters(world_size)
            and operation.waiting != "receiver"]


def named(names: str | Sequence[str]) -> list[Operation]:
    wanted = [n for n in names.split(",") if n] if isinstance(names, str) else list(names)
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown operation(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in wanted]
