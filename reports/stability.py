"""Stability: the repeats of a ``--repeat N`` run folded back into one row per case, and what varied.

fixtures/repeat.py runs each case N times; every verdict is its own record
(conformance.json keeps them all, node ids ending ``-rep3of20``). Here they
fold: a case whose verdicts differ between repeats *varied*; per clause,
target and world size that is one ``Unstable`` entry with its counts and its
distinct errors ("all_gather fails 1 of 20 times on gloo at world size 3").
For a backend under test that is a finding of its own, whatever the single
verdicts say.

Three kinds, most telling first: the contract (no gap declared: the backend
is flaky), a declared gap that showed in some repeats only (the gap is not
what the spec says: it is intermittent), a declared intermittent gap (varied,
as declared). A declared intermittent gap that did *not* vary in N runs is
reported as well (``Steady``): it showed every time (an xfail, really) or
never (fixed, perhaps).

No module of the project is imported here but causes.py: the label of a
target comes from the caller (reports/views.py), which owns it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .causes import cause_key

# A run "showed" a deviation when it did not pass: a failure, an error, or the gap it declares.
SHOWED = ("failed", "error", "xfailed")
KINDS = ("contract", "gap", "intermittent")  # most telling first


def case_key(r) -> str:
    """The node id without the repeat (the ``-repXofN`` id part fixtures/repeat.py adds): one per case."""
    if not getattr(r, "repeats", 0):
        return r.nodeid
    suffix = f"rep{r.repeat}of{r.repeats}"
    for tail in (f"-{suffix}]", f"[{suffix}]"):
        if r.nodeid.endswith(tail):
            return r.nodeid[: -len(tail)] + ("]" if tail.startswith("-") else "")
    return r.nodeid


def case_params(key: str) -> str:
    """The parameters of a case key (``[gloo-ws3-float32]``), or the function name."""
    name = key.split("::")[-1]
    return name[name.index("["):] if "[" in name else name


def _line(r) -> str:
    """The first line a run left: its cause (the gap's actual behaviour for an xfail), '' for a pass."""
    if r.outcome not in SHOWED:
        return ""
    return r.cause or (r.error.splitlines()[0] if r.error else "") or f"({r.outcome}, no error text)"


def distinct_errors(runs: Iterable) -> list[tuple[str, int]]:
    """(first text, runs) per distinct cause (numbers and ranks folded, reports/causes.py), most first."""
    counts: Counter = Counter()
    first: dict[str, str] = {}
    for r in runs:
        line = _line(r)
        if line:
            key = cause_key(line)
            counts[key] += 1
            first.setdefault(key, line)
    return [(first[key], n) for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


@dataclass
class CaseRuns:
    """Every run of one case."""

    key: str
    runs: list = field(default_factory=list)

    @property
    def outcomes(self) -> Counter:
        return Counter(r.outcome for r in self.runs)

    @property
    def showed(self) -> int:
        return sum(1 for r in self.runs if r.outcome in SHOWED)

    @property
    def varied(self) -> bool:
        return len(self.outcomes) > 1

    @property
    def gap(self) -> str:
        """The declared gap: an xfail's reason, or the intermittent gap ('' when held to the contract)."""
        for r in self.runs:
            if r.intermittent:
                return r.intermittent
        return next((r.reason for r in self.runs if r.outcome in ("xfailed", "xpassed")), "")

    @property
    def kind(self) -> str:
        if any(r.intermittent for r in self.runs):
            return "intermittent"
        return "gap" if self.gap else "contract"


@dataclass
class Unstable:
    """One clause on one target at one world size whose verdict varied in some of its cases."""

    area: str
    clause: str
    target: str
    world_size: int
    kind: str  # KINDS
    cases: list = field(default_factory=list)  # CaseRuns that varied

    @property
    def runs(self) -> int:
        return sum(len(c.runs) for c in self.cases)

    @property
    def showed(self) -> int:
        return sum(c.showed for c in self.cases)

    @property
    def outcomes(self) -> Counter:
        return sum((c.outcomes for c in self.cases), Counter())

    @property
    def errors(self) -> list[tuple[str, int]]:
        return distinct_errors(r for c in self.cases for r in c.runs)

    @property
    def gap(self) -> str:
        return next((c.gap for c in self.cases if c.gap), "")

    @property
    def verdict(self) -> str:
        """What varied, after the clause: 'fails 1 of 20 times on gloo at world size 3', as a person says it."""
        where = f"on {self.target} at world size {self.world_size}"
        of = f"{self.showed} of {self.runs} times"
        if len(self.cases) > 1:
            of += f" (in {len(self.cases)} cases)"
        if self.kind == "contract":
            return f"fails {of} {where}"
        if self.kind == "gap":
            return f"its declared gap shows {of} {where} and passes the others (the gap is intermittent, not a strict xfail)"
        return f"its declared intermittent gap shows {of} {where}"

    @property
    def sentence(self) -> str:
        return f"{self.clause.rstrip('. ')} — {self.verdict}"

    @property
    def fraction(self) -> float:
        return self.showed / self.runs if self.runs else 0.0


@dataclass
class Steady:
    """A declared intermittent gap whose cases did not vary in N runs: it showed always, or never."""

    area: str
    clause: str
    target: str
    world_size: int
    reason: str
    always: bool  # showed in every run (else in none)
    cases: list = field(default_factory=list)  # CaseRuns

    @property
    def runs(self) -> int:
        return sum(len(c.runs) for c in self.cases)

    @property
    def verdict(self) -> str:
        what = "showed in every one" if self.always else "showed in none"
        hint = "a strict xfail, really" if self.always else "fixed, perhaps: a gap that no longer holds"
        cases = f"{len(self.cases)} case" + ("" if len(self.cases) == 1 else "s")
        return (f"on {self.target} at world size {self.world_size}, declared intermittent, {what} of {self.runs} runs "
                f"({cases}; {hint})")

    @property
    def sentence(self) -> str:
        return f"{self.clause.rstrip('. ')} — {self.verdict}"


@dataclass
class StabilityView:
    repeats: int  # N of --repeat
    cases: int  # distinct cases that ran repeatedly
    unstable: list = field(default_factory=list)  # Unstable, most telling first
    steady: list = field(default_factory=list)  # Steady

    @property
    def varied_cases(self) -> int:
        return sum(len(u.cases) for u in self.unstable)


def runs_by_case(records) -> dict[str, CaseRuns]:
    """Every repeated case's runs, by case key, in repeat order (records of a plain run are left out)."""
    cases: dict[str, CaseRuns] = {}
    for r in sorted(records, key=lambda r: (r.nodeid, r.repeat)):
        if getattr(r, "repeats", 0):
            cases.setdefault(case_key(r), CaseRuns(case_key(r))).runs.append(r)
    for c in cases.values():
        c.runs.sort(key=lambda r: r.repeat)
    return cases


def stability(records, label: Callable[[object], str]) -> StabilityView | None:
    """The run's stability (None unless it repeated its cases); ``label`` names a record's target."""
    cases = runs_by_case(records)
    if not cases:
        return None
    unstable: dict = {}
    steady: dict = {}
    for c in cases.values():
        first = c.runs[0]
        where = (first.area or "-", first.clause, label(first), first.world_size or 0)
        if c.varied:
            unstable.setdefault((c.kind, *where), Unstable(*where, c.kind)).cases.append(c)
        elif c.kind == "intermittent" and len(c.runs) > 1:
            always = c.showed == len(c.runs)
            steady.setdefault((*where, c.gap, always), Steady(*where, c.gap, always)).cases.append(c)
    # worst first: the contract's instability, then gaps that are not what they say, then the declared ones;
    # inside a kind the larger share of runs that showed the deviation, then more cases
    ordered = sorted(unstable.values(), key=lambda u: (KINDS.index(u.kind), -u.showed / max(u.runs, 1),
                                                       -len(u.cases), u.area, u.clause, u.target, u.world_size))
    repeats = max(r.repeats for c in cases.values() for r in c.runs)
    return StabilityView(repeats, len(cases), ordered,
                         sorted(steady.values(), key=lambda s: (s.area, s.clause, s.target, s.world_size)))


def varied_gap_passes(records) -> set[str]:
    """Node ids of the repeats that passed a declared gap which showed in other repeats of their case.

    They are one varied verdict (Stability), not failures: under --repeat a gap is a non-strict xfail
    (fixtures/repeat.py). A gap passed in every repeat is left out: that one closed, a failure as always."""
    out: set[str] = set()
    for c in runs_by_case(records).values():
        if c.outcomes.get("xpassed") and c.outcomes.get("xfailed"):
            out.update(r.nodeid for r in c.runs if r.outcome == "xpassed")
    return out


def by_kind(unstable: Iterable[Unstable]) -> dict[str, list[Unstable]]:
    grouped: dict = defaultdict(list)
    for u in unstable:
        grouped[u.kind].append(u)
    return {kind: grouped[kind] for kind in KINDS if grouped[kind]}
