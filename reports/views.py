"""What the reports show, computed once from the case records; summary.md and report.html render it.

Every view groups: failures by cause and by clause, gaps by their declared
reason, findings by clause and folded text, skips by reason. A run of a
thousand cases reads as a few dozen lines.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from . import stability as stability_view
from .causes import cause_key
from .folding import Folded, fold

OUTCOMES = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")
BAD = ("failed", "error", "xpassed")
# The worst outcome decides a cell's colour: red, then amber, then green; grey only when nothing ran.
SEVERITY = {"failed": 5, "error": 5, "xpassed": 4, "xfailed": 3, "passed": 2, "skipped": 1}


def _debug(r) -> str:
    """The case's TORCH_DISTRIBUTED_DEBUG level when it is not the default (OFF), else "", and the init mode
    unless lazy. A level that did not take effect in the case's world says so: its cases did not run at it."""
    level = getattr(r, "debug_level", "") or ""
    text = "" if level in ("", "OFF") else level
    if text and getattr(r, "debug_effect", ""):
        text += " (not in effect)"
    init = getattr(r, "init", "") or ""
    if init not in ("", "lazy"):
        text = f"{text} init {init}".strip()
    return text


def target(r) -> str:
    """The backend (with its debug level unless OFF, its init unless lazy), and for an RPC clause the agent too
    (each gets its own rows)."""
    backend = r.backend or "-"
    if _debug(r):
        backend = f"{backend} · debug {_debug(r)}" if getattr(r, "debug_level", "") not in ("", "OFF") \
            else f"{backend} · {_debug(r)}"
    return f"{backend} · rpc {r.rpc_agent}" if getattr(r, "rpc_agent", "") else backend


def levels_not_in_effect(records) -> dict[str, str]:
    """Per world (backend ws<n> level) whose debug level did not take effect: why (fixtures/debug_level.py)."""
    worlds: dict[str, str] = {}
    for r in records:
        if getattr(r, "debug_effect", ""):
            worlds.setdefault(f"{r.backend} ws{r.world_size} {r.debug_level}", r.debug_effect)
    return dict(sorted(worlds.items()))


@dataclass(frozen=True, order=True)
class Column:
    """One column of the contract view: where a case ran."""

    backend: str
    world_size: int
    agent: str = ""
    debug: str = ""  # TORCH_DISTRIBUTED_DEBUG level unless OFF

    @property
    def label(self) -> str:
        text = f"{self.backend} ws{self.world_size}" + (f" {self.debug}" if self.debug else "")
        return f"{text} · {self.agent}" if self.agent else text


def column(r) -> Column:
    return Column(r.backend or "-", r.world_size or 0, getattr(r, "rpc_agent", "") or "", _debug(r))


def case_id(nodeid: str) -> str:
    """The part of a node id after the function name (its parameters), or the function name."""
    name = nodeid.split("::")[-1]
    return name[name.index("["):] if "[" in name else name


def worst(outcomes) -> str:
    return max(outcomes, key=lambda o: SEVERITY.get(o, 0), default="")


def totals(records) -> Counter:
    return Counter(r.outcome for r in records)


# ------------------------------------------------------------ backend x area
def matrix(records) -> tuple[list[str], list[str], dict]:
    """(targets, areas, {(target, area): Counter of outcomes})."""
    cells: dict = defaultdict(Counter)
    for r in records:
        cells[(target(r), r.area or "-")][r.outcome] += 1
    targets = sorted({t for t, _ in cells})
    areas = sorted({a for _, a in cells})
    return targets, areas, dict(cells)


# ------------------------------------------------------------------ failures
@dataclass
class CauseGroup:
    cause: str  # the first case's cause, as it read
    key: str
    cases: list = field(default_factory=list)

    @property
    def clauses(self) -> list[str]:
        return sorted({r.clause for r in self.cases})

    @property
    def targets(self) -> list[str]:
        return sorted({target(r) for r in self.cases})


def failures(records) -> list:
    """Failing records; a repeat that passed a declared gap which showed in other repeats is a varied verdict
    (reports/stability.py), not a failure."""
    varied = stability_view.varied_gap_passes(records)
    return sorted((r for r in records if r.outcome in BAD and r.nodeid not in varied), key=lambda r: r.nodeid)


def failure_line(r) -> str:
    """The cause of a failure; an xpass is a gap that closed."""
    if r.outcome == "xpassed":
        return f"passed although a gap is declared (strict xfail): {r.reason}"
    return r.cause or (r.error.splitlines()[0] if r.error else "(no error text recorded)")


def failures_by_cause(records) -> list[CauseGroup]:
    """Most frequent cause first."""
    groups: dict[str, CauseGroup] = {}
    for r in failures(records):
        line = failure_line(r)
        key = cause_key(line)
        groups.setdefault(key, CauseGroup(line, key)).cases.append(r)
    return sorted(groups.values(), key=lambda g: (-len(g.cases), g.key))


def failing_cases(records) -> list[tuple[str, str, str, list]]:
    """[(area, clause, case key, every run of the case)] per failing case, the repeats of a case
    (--repeat) folded into one entry; in area, clause and case order."""
    failing = {stability_view.case_key(r) for r in failures(records)}
    runs: dict = defaultdict(list)
    for r in records:
        key = stability_view.case_key(r)
        if key in failing:
            runs[key].append(r)
    rows = [(rs[0].area or "-", rs[0].clause, key, sorted(rs, key=lambda r: r.repeat)) for key, rs in runs.items()]
    return sorted(rows, key=lambda row: row[:3])


# ----------------------------------------------------------------- stability
def stability(records) -> "stability_view.StabilityView | None":
    """--repeat: the clauses whose verdict varied, per target and world size (None for a plain run)."""
    return stability_view.stability(records, target)


# ---------------------------------------------------------------------- gaps
@dataclass
class GapGroup:
    reason: str  # the declared gap without its owner's prefix, as the first case read
    key: str
    cases: list = field(default_factory=list)

    @property
    def owners(self) -> list[str]:
        """Whose gap it is ("gloo", "RPC agent tensorpipe", ...): the reasons' prefixes."""
        return sorted({r.reason.split(": ", 1)[0] for r in self.cases if ": " in r.reason})

    @property
    def targets(self) -> list[str]:
        return sorted({column(r).label for r in self.cases})

    @property
    def behaviour(self) -> str:
        """What the implementation actually did, in the first case that showed the gap ('' when the
        clause declared the gap at run time with pytest.xfail: its reason says it all)."""
        for r in self.cases:
            line = r.cause or (r.error.splitlines()[0] if r.error else "")
            if line and not line.startswith(("_pytest.outcomes.XFailed", "XFailed")):
                return line
        return ""


def gaps(records) -> list[GapGroup]:
    """One group per declared gap; the same text declared by several owners (agents) is one gap."""
    groups: dict[str, GapGroup] = {}
    for r in sorted(records, key=lambda r: r.nodeid):
        if r.outcome == "xfailed":
            text = r.reason.split(": ", 1)[1] if ": " in r.reason else r.reason
            key = cause_key(text)
            groups.setdefault(key, GapGroup(text, key)).cases.append(r)
    return sorted(groups.values(), key=lambda g: (g.owners, g.key))


# ------------------------------------------------------------------ findings
@dataclass
class FindingGroup:
    area: str
    clause: str
    folded: Folded  # folded over every case of the clause
    cases: list = field(default_factory=list)


def findings_by_clause(records) -> list[FindingGroup]:
    """One entry per clause and distinct finding (ranks and numbers folded), with its cases."""
    by_clause: dict = defaultdict(list)
    for r in sorted(records, key=lambda r: r.nodeid):
        for text in r.findings:
            by_clause[(r.area or "-", r.clause)].append((text, r))
    out = []
    for (area, clause), pairs in sorted(by_clause.items()):
        for entry in fold(text for text, _ in pairs):
            members = set(entry.originals)
            cases = list({r.nodeid: r for text, r in pairs if text in members}.values())
            out.append(FindingGroup(area, clause, entry, cases))
    return out


# --------------------------------------------------------------------- skips
def skips(records) -> list[tuple[str, list[str], int]]:
    """[(reason, targets, cases)], most cases first."""
    counts: Counter = Counter()
    where: dict = defaultdict(set)
    for r in records:
        if r.outcome == "skipped":
            counts[r.reason] += 1
            where[r.reason].add(target(r))
    return [(reason, sorted(where[reason]), n) for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


# ------------------------------------------------------------- contract view
@dataclass
class Cell:
    cases: list = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return worst(r.outcome for r in self.cases)

    @property
    def counts(self) -> Counter:
        return totals(self.cases)

    @property
    def notes(self) -> list[tuple[str, str, int]]:
        """What a reader sees without a click: (outcome, text, cases) per distinct failure cause, gap reason
        or skip reason, worst first."""
        seen: dict = {}
        for r in self.cases:
            if r.outcome in BAD:
                text = failure_line(r)
            elif r.outcome == "xfailed":
                text = f"gap: {r.reason}"
            elif r.outcome == "skipped":
                text = f"skipped: {r.reason}"
            else:
                continue
            key = (r.outcome, cause_key(text))
            if key not in seen:
                seen[key] = [r.outcome, text, 0]
            seen[key][2] += 1
        return sorted((tuple(v) for v in seen.values()), key=lambda n: (-SEVERITY.get(n[0], 0), -n[2]))


@dataclass
class ClauseRow:
    clause: str
    test: str  # the test function's node id without parameters
    cells: dict = field(default_factory=dict)  # Column -> Cell

    @property
    def outcome(self) -> str:
        return worst(cell.outcome for cell in self.cells.values())


@dataclass
class AreaView:
    area: str
    columns: list
    rows: list


def contract_view(records) -> list[AreaView]:
    """Per area: one row per clause, one column per (backend, world size, agent) that ran it."""
    by_area: dict = defaultdict(dict)
    columns: dict = defaultdict(set)
    for r in sorted(records, key=lambda r: r.nodeid):
        area = r.area or "-"
        test = r.nodeid.split("[")[0]
        row = by_area[area].setdefault((r.clause, test), ClauseRow(r.clause, test))
        row.cells.setdefault(column(r), Cell()).cases.append(r)
        columns[area].add(column(r))
    return [AreaView(area, sorted(columns[area]), list(rows.values())) for area, rows in sorted(by_area.items())]


# -------------------------------------------------------------------- timing
def slowest(records, n: int = 15) -> list:
    return sorted(records, key=lambda r: -r.duration)[:n]


@dataclass
class AreaTime:
    """The time of one backend (and agent) in one area: where a user looks for what to deselect."""

    target: str
    area: str
    cases: int
    total: float
    mean: float
    slowest: object

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.total if self.total > 0 else 0.0


def durations_by_area(records) -> list[AreaTime]:
    """Per (backend/agent, area), most total time first (skipped cases count; their time is their set-up)."""
    by_area: dict = defaultdict(list)
    for r in records:
        by_area[(target(r), r.area or "-")].append(r)
    out = [AreaTime(t, area, len(rs), sum(r.duration for r in rs), sum(r.duration for r in rs) / len(rs),
                    max(rs, key=lambda r: r.duration)) for (t, area), rs in by_area.items()]
    return sorted(out, key=lambda t: -t.total)


@dataclass
class ClauseTime:
    """One clause (a test function, every parameter and target together)."""

    area: str
    function: str  # file::function
    clause: str  # its first docstring line
    cases: int
    total: float
    slowest: object


def slowest_clauses(records, n: int = 10) -> list[ClauseTime]:
    """The ``n`` clauses that took the most time in all, with their slowest case."""
    by_function: dict = defaultdict(list)
    for r in records:
        by_function[r.nodeid.split("[", 1)[0]].append(r)
    out = [ClauseTime(rs[0].area or "-", function, getattr(rs[0], "clause", "") or "", len(rs),
                      sum(r.duration for r in rs), max(rs, key=lambda r: r.duration))
           for function, rs in by_function.items()]
    return sorted(out, key=lambda c: -c.total)[:n]
