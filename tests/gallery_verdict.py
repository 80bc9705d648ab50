"""The gallery's verdict on one bug: caught by a clause it names, by another clause, not at all, or crashed.

A case of the bug's backend can fail for a reason that says nothing about
the contract: the bug's own module raised (a TypeError from an override whose
signature the backend outgrew counted as a catch for months). So a failure is
judged by where it came from (tests/gallery_failures.py records it):

- **crashed, not caught**: an exception of the failure, in the pytest process
  or in a rank that relayed it, was raised in the bug's own module (its
  innermost frame is there, or it is a call to one of that module's
  functions with the wrong arguments), or the module failed to import;
- **caught**: otherwise, when the case belongs to a clause the bug's record
  names (its check failed: an assertion, a harness deadline, a torch error
  the clause does not accept);
- **caught by the wrong clause**: otherwise: a clause the record does not
  name failed, so the record or the suite is wrong; it fails the gallery
  like a miss, naming the clause.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tests.gallery_failures import FailedCase, Raised
from tests.gallery_record import SeededBug

CAUGHT = "caught"
CRASHED = "crashed, not caught"
WRONG_CLAUSE = "caught by the wrong clause"
NOT_CAUGHT = "not caught"
HARNESS_ERRORS = "set-up or teardown errors"


@dataclass(frozen=True)
class Verdict:
    bug: str
    kind: str  # one of the constants above
    detail: str  # which cases and why: the text the gallery's failure shows

    @property
    def ok(self) -> bool:
        return self.kind == CAUGHT

    def text(self) -> str:
        return f"seeded bug {self.bug!r}: {self.kind}: {self.detail}"


def raised_in(path: str, raised: Raised) -> bool:
    """Whether ``raised`` came from file ``path`` (relative to the repository): where it was raised, or the
    function of that file a mismatched call named."""
    origins = [os.path.normpath(origin) for origin in raised.origins]
    return any(origin == path or origin.endswith(os.sep + path) for origin in origins)


def crash_of(bug: SeededBug, case: FailedCase) -> Raised | None:
    """The exception of ``case`` (local or any rank's, any of a chain) raised in the bug's module, None if none."""
    path = bug.path
    for raised in (*case.raised, *(r for chain in case.ranks for r in chain)):
        if raised_in(path, raised):
            return raised
    return None


def _line(raised: Raised) -> str:
    return f"{raised.exc_type}: {raised.message}" if raised.message else raised.exc_type


def judge(bug: SeededBug, cases: list[dict], failures: list[FailedCase]) -> Verdict:
    """The verdict on ``bug`` from its run's conformance.json cases and its plugin's failure records."""
    mine = [case for case in failures if case.backend == bug.backend]
    for case in mine:
        crash = crash_of(bug, case)
        if crash is not None:
            where = "at import" if case.when == "import" else f"in {case.nodeid} ({case.when})"
            return Verdict(bug.name, CRASHED, f"{_line(crash)}, raised in {bug.path} {where}: the bug's own "
                                              "code failed, no clause's check did")
    own = [case for case in cases if case.get("backend") == bug.backend]
    failed = [case["nodeid"] for case in own if case.get("outcome") == "failed"]
    errors = [case["nodeid"] for case in own if case.get("outcome") == "error"]
    named = ", ".join(bug.clauses)
    if errors:
        return Verdict(bug.name, HARNESS_ERRORS, "the bug module may break the harness rather than a contract: "
                                                 + ", ".join(errors))
    if not failed:
        return Verdict(bug.name, NOT_CAUGHT, f"no case of backend {bug.backend} failed ({len(own)} cases); "
                                             f"expected to be caught by {named}: {bug.contract}")
    right = [nodeid for nodeid in failed if bug.caught_by(nodeid)]
    if not right:
        return Verdict(bug.name, WRONG_CLAUSE, f"{', '.join(failed)} failed, but the record names {named} "
                                               "(tests/seeded/registry.py): fix the record or the clause")
    return Verdict(bug.name, CAUGHT, ", ".join(right))
