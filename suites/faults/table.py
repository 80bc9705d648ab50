"""The table of network faults: one record per fault, the one home every fault clause and measurement reads.

Like suites/collectives.py for collectives: a record says what the fault models, which traffic it
takes (``plane``), and how it is injected on one simulated host and healed (fixtures/hosts does the
namespaces and the nftables/tc work). ``when`` is decided by the caller: ``before_connect`` (the fault is
in place before the backend's first connection, as under lazy init) or ``mid_operation`` (in the middle
of a job whose connections exist).

A fault is injected on the host of one rank, "the cut-off rank"; its peers see it through the network
only, except ``frozen``, which stops the rank's process (no network state at all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fixtures.hosts import SimulatedHosts, Traffic
from fixtures.hosts import faults as host_faults

PLANES = ("both", "data", "control")  # control: the store's connections; data: the backend's own
WHEN = ("before_connect", "mid_operation")
ENDS_BY = ("timeout", "reset")  # frames vanish (only a timeout ends a wait), or the host answers with resets (at once)

SLOW_RATE = "8mbit"  # a slow link: 1 MiB in about a second
LOSS_PERCENT = 10  # random loss TCP retransmits through
CUT_AFTER_BYTES = 256 * 1024  # a connection reset in the middle of a large collective


@dataclass(frozen=True)
class Target:
    """Where a fault lands: the hosts, the cut-off rank's host index and process id, the store's port."""

    hosts: SimulatedHosts
    index: int
    pid: int
    store_port: int

    def traffic(self, plane: str, direction: str = "both") -> Traffic:
        if plane == "both":
            return Traffic(direction)
        return Traffic(direction, port=self.store_port, only_port=plane == "control")


Inject = Callable[[Target], None]


@dataclass(frozen=True, kw_only=True)
class Fault:
    name: str
    doc: str  # what it models, one line (the report shows it)
    inject: Inject
    heal: Inject
    plane: str = "both"
    breaks: bool = True  # False: a negative control, an operation within its timeout must still succeed
    min_payload: int = 0  # bytes an operation must move for the fault to bite (cut_after_bytes)
    ends_by: str = "timeout"  # ENDS_BY: how a wait across a breaking fault ends ("" for a negative control)
    stops_the_rank: bool = False  # the cut-off rank's process stops (frozen): its own calls to third parties pass
    # what the others send still reaches the cut-off rank (one direction only; frozen: buffered until it thaws)
    cut_rank_hears: bool = False

    def __post_init__(self) -> None:
        if self.plane not in PLANES:
            raise ValueError(f"fault {self.name}: plane must be one of {', '.join(PLANES)}, not {self.plane!r}")
        if (self.ends_by in ENDS_BY) != self.breaks or self.ends_by not in (*ENDS_BY, ""):
            raise ValueError(f"fault {self.name}: a breaking fault ends waits by one of {', '.join(ENDS_BY)}, a "
                             f"negative control by none (''), not {self.ends_by!r}")


def _heal(target: Target) -> None:
    target.hosts.heal(target.index)


def _thaw(target: Target) -> None:
    host_faults.thaw(target.pid)


def _freeze(target: Target) -> None:
    host_faults.freeze(target.pid)


def _drop(plane: str, direction: str = "both", loss: int = 100) -> Inject:
    return lambda t: t.hosts.drop(t.index, t.traffic(plane, direction), loss)


FAULTS: Sequence[Fault] = (
    Fault(name="partition", doc="silent partition: every frame to and from the host dropped",
          inject=lambda t: t.hosts.partition(t.index), heal=_heal),
    # the backend's connections only: torch's TCPStore client does not reconnect, so a reset store connection
    # would leave the rank unable to make any group again, healed or not (measured: DistNetworkError)
    Fault(name="refused", doc="the host answers the backend's TCP segments with resets (refused, reset connections)",
          inject=lambda t: t.hosts.reset(t.index, t.traffic("data")), heal=_heal, plane="data", ends_by="reset"),
    Fault(name="one_way", doc="half a partition: what the host sends is dropped, what it receives arrives",
          inject=_drop("both", "from_host"), heal=_heal, cut_rank_hears=True),
    Fault(name="flap", doc="the host's switch port goes down (carrier lost) until healed",
          inject=lambda t: t.hosts.link_down(t.index), heal=lambda t: t.hosts.link_up(t.index)),
    Fault(name="slow", doc=f"the host's link is rate limited to {SLOW_RATE} both ways",
          inject=lambda t: t.hosts.rate_limit(t.index, SLOW_RATE), heal=_heal, breaks=False, ends_by=""),
    Fault(name="lossy", doc=f"{LOSS_PERCENT}% of the host's TCP segments lost at random",
          inject=_drop("both", loss=LOSS_PERCENT), heal=_heal, breaks=False, ends_by=""),
    Fault(name="cut_after_bytes", doc=f"each backend connection reset once it carried {CUT_AFTER_BYTES} bytes",
          inject=lambda t: t.hosts.cut_after(t.index, t.traffic("data"), CUT_AFTER_BYTES), heal=_heal, plane="data",
          min_payload=4 * CUT_AFTER_BYTES, ends_by="reset"),
    Fault(name="frozen", doc="the rank's process stopped (SIGSTOP) until healed (SIGCONT)",
          inject=_freeze, heal=_thaw, stops_the_rank=True, cut_rank_hears=True),
    Fault(name="control_plane", doc="only the store's connections dropped; the backend's own pass",
          inject=_drop("control"), heal=_heal, plane="control"),
    Fault(name="data_plane", doc="only the backend's own connections dropped; the store's pass",
          inject=_drop("data"), heal=_heal, plane="data"),
)
TABLE: dict[str, Fault] = {fault.name: fault for fault in FAULTS}


def named(names: str | Sequence[str]) -> list[Fault]:
    """Faults by name (a comma-separated string or a list), with an error naming the unknown ones."""
    wanted = [n for n in names.split(",") if n] if isinstance(names, str) else list(names)
    unknown = [n for n in wanted if n not in TABLE]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(TABLE)}")
    return [TABLE[n] for n in wanted]
