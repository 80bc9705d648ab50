"""The Faults section's data: how each rank's operation ended under a network fault, from the fault clauses.

A fault scenario (suites/faults/) records one figure per operation it timed under a fault, as the case's
user property ``fault_figure`` (a plain dict, so it travels with pytest-xdist's reports and lands in
conformance.json). Several clauses read one scenario, so the same figure arrives from several cases: the view
keeps one per (fault, target, world size, operation). A figure is decoded strictly: a malformed one is
reported as such, never half-read.
"""

from __future__ import annotations

from dataclasses import dataclass


class BadFigure(ValueError):
    """A ``fault_figure`` property that is not what suites/faults records."""


@dataclass(frozen=True)
class RankEnd:
    rank: int
    seconds: float
    ok: bool
    error: str  # '' when ok


@dataclass(frozen=True)
class FaultFigure:
    fault: str
    target: str  # the backend, or the RPC agent
    world_size: int
    operation: str
    timeout_s: float  # what the operation was given
    ranks: tuple[RankEnd, ...]

    @property
    def key(self) -> tuple:
        return (self.fault, self.target, self.world_size, self.operation)

    @property
    def raised(self) -> list[RankEnd]:
        return [r for r in self.ranks if not r.ok]

    @property
    def detect_s(self) -> float | None:
        """How long the slowest rank took to learn of the fault (None when no rank raised)."""
        return max((r.seconds for r in self.raised), default=None)

    @property
    def ratio(self) -> float | None:
        """``detect_s`` over the timeout: 1.0 is 'exactly its timeout', near 0 'at once'."""
        return None if self.detect_s is None or self.timeout_s <= 0 else self.detect_s / self.timeout_s

    @property
    def outcome(self) -> str:
        raised = len(self.raised)
        if raised == 0:
            return f"all {len(self.ranks)} ok"
        if raised == len(self.ranks):
            return f"all {raised} raised"
        return f"{raised} of {len(self.ranks)} raised"

    @property
    def error(self) -> str:
        """The first raising rank's error (the report folds the rest away)."""
        return next((r.error for r in self.raised), "")


def _field(data: dict, name: str, kind, where: str):
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadFigure(f"{where}: {name!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def decode(data) -> FaultFigure:
    """A figure from its property dict; BadFigure naming the first problem."""
    if not isinstance(data, dict):
        raise BadFigure(f"fault_figure must be a dict, got {type(data).__name__}")
    ranks = _field(data, "ranks", list, "fault_figure")
    ends = []
    for i, rank in enumerate(ranks):
        if not isinstance(rank, dict):
            raise BadFigure(f"fault_figure rank {i}: must be a dict, got {type(rank).__name__}")
        where = f"fault_figure rank {i}"
        ends.append(RankEnd(_field(rank, "rank", int, where), float(_field(rank, "seconds", (int, float), where)),
                            _field(rank, "ok", bool, where), str(rank.get("error") or "")))
    return FaultFigure(_field(data, "fault", str, "fault_figure"), _field(data, "target", str, "fault_figure"),
                       _field(data, "world_size", int, "fault_figure"), _field(data, "operation", str, "fault_figure"),
                       float(_field(data, "timeout_s", (int, float), "fault_figure")), tuple(ends))


def encode(fault: str, target: str, world_size: int, operation: str, timeout_s: float, ranks: list[dict]) -> dict:
    """The property a scenario records: ranks as [{"rank", "seconds", "ok", "error"}]."""
    figure = {"fault": fault, "target": target, "world_size": world_size, "operation": operation,
              "timeout_s": float(timeout_s),
              "ranks": [{"rank": int(r["rank"]), "seconds": round(float(r["seconds"]), 3), "ok": bool(r["ok"]),
                         "error": "" if r["ok"] else str(r.get("error", ""))[:500]} for r in ranks]}
    decode(figure)  # what is recorded is what the report can read
    return figure


def fault_figures(records) -> tuple[list[FaultFigure], list[str]]:
    """Every distinct figure of the run, slowest detection relative to its timeout first, and the problems of
    the properties that did not decode (a recorder's bug shows in the report instead of breaking it)."""
    figures: dict[tuple, FaultFigure] = {}
    problems: list[str] = []
    for record in records:
        for data in getattr(record, "fault_figures", ()):
            try:
                figure = decode(data)
            except BadFigure as exc:
                problems.append(f"{record.nodeid}: {exc}")
                continue
            figures.setdefault(figure.key, figure)
    ordered = sorted(figures.values(), key=lambda f: (-(f.ratio if f.ratio is not None else -1), f.key))
    return ordered, problems
