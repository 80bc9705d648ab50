"""Synthetic case records for the report tests: a run far larger than any real one, built in memory."""

from __future__ import annotations

from reports.records import CaseRecord

UNSTABLE_CLAUSE = "all_gather into a list: entry i on every rank is rank i's tensor."
FLAKY_CAUSE = "AssertionError: all_gather entry 0 on rank 1: 6 of 6 elements wrong"


def record(nodeid: str, outcome: str, **fields) -> CaseRecord:
    base = dict(area="c10d", clause=f"clause of {nodeid.split('[')[0]}", backend="gloo", world_size=2,
                duration=0.01)
    base.update(fields)
    return CaseRecord(nodeid=nodeid, outcome=outcome, **base)


def repeated(test: str, params: str, outcomes: list[str], **fields) -> list[CaseRecord]:
    """One record per repeat of ``test[params]``, ids as fixtures/repeat.py makes them."""
    n = len(outcomes)
    out = []
    for i, outcome in enumerate(outcomes, 1):
        extra = dict(fields)
        if outcome == "failed":
            extra.setdefault("cause", FLAKY_CAUSE)
            extra.setdefault("error", FLAKY_CAUSE)
        out.append(record(f"{test}[{params}-rep{i}of{n}]", outcome, repeat=i, repeats=n, **extra))
    return out


def flaky_all_gather(repeats: int = 20) -> list[CaseRecord]:
    """all_gather at world size 3 failing in 1 of ``repeats`` runs: the Stability section's example."""
    outcomes = ["passed"] * repeats
    outcomes[repeats // 2] = "failed"
    return repeated("suites/c10d/test_gather_scatter.py::test_all_gather_list", "gloo-ws3-float32", outcomes,
                    clause=UNSTABLE_CLAUSE, world_size=3)


def large_run(n: int = 40, repeats: int = 3) -> list[CaseRecord]:
    """Every section of a report, each far beyond what a summary can list: ``n`` failure causes, gaps,
    skip reasons and unstable clauses, ``n * 50`` findings, long texts everywhere."""
    long = " with a long explanation" * 20
    records: list[CaseRecord] = []
    for i in range(n):
        records.append(record(f"suites/c10d/test_f{i}.py::test_fails[gloo-ws2]", "failed",
                              cause=f"RuntimeError: cause {chr(65 + i % 26)}{i} {long}", error=f"RuntimeError: {long}"))
        records.append(record(f"suites/c10d/test_g{i}.py::test_gap[gloo-ws2]", "xfailed",
                              reason=f"gloo: gap {chr(65 + i % 26)}{i} {long}", cause=f"RuntimeError: gap {i} {long}"))
        records.append(record(f"suites/c10d/test_s{i}.py::test_skip[gloo-ws2]", "skipped",
                              reason=f"skip reason {chr(65 + i % 26)}{i} {long}"))
        records.append(record(f"suites/c10d/test_p{i}.py::test_found[gloo-ws2]", "passed", clause=f"clause {i} {long}",
                              findings=[f"finding {chr(65 + j % 26)}{j} of {i} {long}" for j in range(50)]))
        records += repeated(f"suites/p2p/test_u{i}.py::test_flaky", "reference-ws3",
                            ["passed"] * (repeats - 1) + ["failed"], area="p2p", backend="reference", world_size=3,
                            clause=f"unstable clause {i} {long}", cause=f"RuntimeError: flaky {i} {long}",
                            error=f"RuntimeError: flaky {i}")
        records += repeated(f"suites/p2p/test_i{i}.py::test_steady", "reference-ws3", ["passed"] * repeats,
                            area="p2p", backend="reference", world_size=3, intermittent=f"reference: slow {i} {long}")
    return records
