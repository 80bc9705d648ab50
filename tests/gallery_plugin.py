"""pytest plugin of the seeded-bug gallery's runs: each bug's backend runs only its own clauses, until its first failure.

The gallery (tests/test_seeded_bugs.py) runs several bugs in one pytest of
the suite, each planted in a backend named after its module. This plugin,
loaded there with ``-p tests.gallery_plugin --gallery-plan PLAN.json``, gives
every backend of the plan what a run of that bug alone would have given it:

- only the cases its module names: ``SUITE`` (a folder, a file or a clause's
  node id) and an optional ``-k`` keyword, a word matched, as pytest's ``-k``
  matches one, against the case's name (its clause and parameters) without
  regard to case; every other case of that backend is deselected;
- ``-x`` per backend: once a case of a clause the bug's record names failed
  (its bug is caught), that backend's remaining cases are skipped, saying by
  which case, so a caught bug costs no more than it did alone and the next
  backend's world starts. A failure of another clause is recorded and the
  run goes on, so the named clause always runs;
- the named clauses first: a backend's cases of the clauses its record names
  run before its other cases (in the places its cases hold), so a caught bug
  costs its named clause's cases, not every case of its file before them.

Cases of backends the plan does not name are left alone. With
``--gallery-failures FAILURES.json`` it also records where each failure of a
plan backend came from (tests/gallery_failures.py): the exceptions and the
files their frames ran in, the ranks' too for a failure relayed from ranks;
the gallery's verdict reads them.
"""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import dataclass

import pytest

from fixtures.errors import RankError
from fixtures.pytest_plugin import target_of
from tests.gallery_failures import SIGNATURE_MISMATCH, FailedCase, Raised, chain_from_text, write_failures
from tests.gallery_record import clause_matches

_CAUGHT = pytest.StashKey[dict]()  # backend -> node id of its first failed case
_PLAN = pytest.StashKey[dict]()
_FAILURES = pytest.StashKey[list]()  # FailedCase of the plan's backends, written at the end of the session


@dataclass(frozen=True)
class Selection:
    """The cases one bug's backend runs: under ``suite``, and whose name contains ``keyword`` (if any); its
    ``clauses`` (the record's: none means any) are the ones whose failure stops the backend (per-backend ``-x``)."""

    suite: str
    keyword: str = ""
    clauses: tuple[str, ...] = ()

    def stops_at(self, nodeid: str) -> bool:
        """Whether a failure of ``nodeid`` ends this backend's run: a clause the record names failed. A bug that
        two clauses catch, whichever fails first (a race such as early completion), would otherwise be judged by
        whichever ran first, and its named clause might never run."""
        return not self.clauses or any(clause_matches(clause, nodeid) for clause in self.clauses)

    def selects(self, nodeid: str, name: str) -> bool:
        if self.keyword and self.keyword.lower() not in name.lower():
            return False
        if self.suite.endswith("/"):  # a folder
            return nodeid.startswith(self.suite)
        if "::" in self.suite:  # a clause, with any parameters
            return nodeid == self.suite or nodeid.startswith((self.suite + "[", self.suite + "::"))
        return nodeid.startswith(self.suite + "::")  # a file


def _clauses(entry: dict) -> tuple:
    clauses = entry.get("clauses", [])
    if not isinstance(clauses, list):
        raise TypeError(f"clauses must be a list of node ids, not {clauses!r}")
    return tuple(clauses)


def read_plan(path: str) -> dict[str, Selection]:
    """``{backend: {"suite": ..., "keyword": ...}}`` from ``path``, refused with the problem named."""
    try:
        with open(path) as fh:
            raw = json.load(fh)
        plan = {backend: Selection(entry["suite"], entry.get("keyword", ""), _clauses(entry))
                for backend, entry in raw.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise pytest.UsageError(f"--gallery-plan {path}: not a plan ({{backend: {{suite, keyword}}}}): {exc!r}") from None
    for backend, selection in plan.items():
        if not all(isinstance(clause, str) and clause for clause in selection.clauses):
            raise pytest.UsageError(f"--gallery-plan {path}: {backend}'s clauses must be node ids, "
                                    f"not {selection.clauses!r}")
        if not isinstance(selection.suite, str) or not selection.suite or not isinstance(selection.keyword, str):
            raise pytest.UsageError(f"--gallery-plan {path}: {backend}'s suite must be a path and its keyword a "
                                    f"string, not {selection.suite!r} and {selection.keyword!r}")
        if selection.keyword and not selection.keyword.replace("_", "").isalnum():
            raise pytest.UsageError(f"--gallery-plan {path}: {backend}'s keyword {selection.keyword!r} is not one "
                                    "word (the gallery matches one word, not a -k expression)")
    return plan


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gallery-plan", default=None, metavar="PLAN.json",
                     help="the seeded-bug gallery's plan: which cases each bug's backend runs (tests/gallery_plugin.py)")
    parser.addoption("--gallery-failures", default=None, metavar="FAILURES.json",
                     help="where the gallery's run writes where each failure of a plan backend came from")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("gallery_plan")
    config.stash[_PLAN] = read_plan(path) if path else {}
    config.stash[_CAUGHT] = {}
    config.stash[_FAILURES] = []


def _write(config: pytest.Config, cases: list[FailedCase]) -> None:
    path = config.getoption("gallery_failures")
    if path:
        write_failures(path, cases)


def _callee(message: str) -> str:
    """The file of the bug module's function a signature-mismatch TypeError names ('' if none of the plan's does)."""
    match = SIGNATURE_MISMATCH.match(message)
    if match is None:
        return ""
    first, *rest = match["qualname"].split(".")
    for name, module in list(sys.modules.items()):
        if not name.startswith("tests.") or module is None:  # bug modules: tests.seeded, the gallery's own tests'

            continue
        found = getattr(module, first, None)
        for part in rest:
            found = getattr(found, part, None)
        if found is not None and getattr(found, "__module__", None) == name:
            return inspect.getsourcefile(module) or ""
    return ""


def _raised(exc_type: str, message: str, frames: tuple[str, ...]) -> Raised:
    first = message.strip().splitlines()[0] if message.strip() else ""
    return Raised(exc_type, first, frames, _callee(first) if exc_type.endswith("TypeError") else "")


def _chain(exc: BaseException) -> tuple[Raised, ...]:
    """``exc`` and the exceptions it was raised from or while handling, the earliest first, as a traceback prints."""
    chain: list[Raised] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = []
        tb = current.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_filename)
            tb = tb.tb_next
        name = type(current).__qualname__
        module = type(current).__module__
        chain.append(_raised(name if module == "builtins" else f"{module}.{name}", str(current), tuple(frames)))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return tuple(reversed(chain))


def _ranks(exc: BaseException) -> tuple[tuple[Raised, ...], ...]:
    """Each failed rank's exceptions, read from the traceback it relayed (a RankError's failures)."""
    if not isinstance(exc, RankError):
        return ()
    ranks = []
    for _, failure in sorted(exc.failures.items()):
        ranks.append(tuple(_raised(r.exc_type, r.message, r.frames) for r in chain_from_text(failure.traceback)))
    return tuple(ranks)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    plan = config.stash[_PLAN]
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        target = target_of(item)
        selection = plan.get(target.backend) if target is not None else None
        (keep if selection is None or selection.selects(item.nodeid, item.name) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = _named_clauses_first(keep, plan)


def _named_clauses_first(items: list[pytest.Item], plan: dict[str, Selection]) -> list[pytest.Item]:
    """``items`` with each plan backend's cases of the clauses its record names moved ahead of its other cases, into
    the places its cases already hold (other backends' cases stay where they are).

    The verdict reads only whether a named clause failed (tests/gallery_verdict.py), and a named clause's failure
    skips the backend's other cases: run first, it spares a caught bug every case of its file before it (a run of
    eight bugs on c10d's files ran 320 passing cases to catch them). A bug a named clause misses still runs the
    rest, so a failure of another clause still shows as the wrong clause."""
    places: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        target = target_of(item)
        if target is not None and target.backend in plan and plan[target.backend].clauses:
            places.setdefault(target.backend, []).append(index)
    ordered = list(items)
    for backend, indices in places.items():
        stops_at = plan[backend].stops_at
        named_first = sorted((items[i] for i in indices), key=lambda item: not stops_at(item.nodeid))  # stable
        for index, item in zip(indices, named_first):
            ordered[index] = item
    return ordered


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    target = target_of(item)
    caught = item.config.stash[_CAUGHT].get(target.backend) if target is not None else None
    if target is not None and caught:
        pytest.skip(f"the gallery: {target.backend}'s bug was already caught by {caught}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    target = target_of(item)
    selection = item.config.stash[_PLAN].get(target.backend) if target is not None else None
    if target is not None and selection is not None and report.failed:
        if selection.stops_at(item.nodeid):
            item.config.stash[_CAUGHT].setdefault(target.backend, item.nodeid)
        if call.excinfo is not None:
            exc = call.excinfo.value
            item.config.stash[_FAILURES].append(
                FailedCase(item.nodeid, target.backend, report.when, _chain(exc), _ranks(exc)))
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write(session.config, session.config.stash.get(_FAILURES, []))
