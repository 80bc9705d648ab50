"""summary.md: the verdict, for a terminal: under 12 KB however many cases, findings or repeats.

A verdict line; the backend x area table; failures grouped by cause (the
ranks' own exception, normalised: a backend author fixes causes, not rows),
then the first failing cases; stability (``--repeat``: the clauses whose
verdict varied, with counts and errors); the known gaps with most cases;
findings and skips counted, with the first few; the slowest clauses. Each
section shows its worst few (``SHOWN``) and counts the rest: every entry,
finding, rank text and timing is in report.html and conformance.json.
"""

from __future__ import annotations

from . import views
from .fault_figures import fault_figures
from .views import OUTCOMES


def cell(text: str, limit: int = 160) -> str:
    """One table cell: the first non-empty line, pipes escaped, clipped."""
    line = next((l.strip() for l in (text or "").splitlines() if l.strip()), "")
    line = line if len(line) <= limit else line[: limit - 1] + "…"
    return line.replace("|", "\\|")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _header(records, meta: dict) -> list[str]:
    facts = [f"backends: `{meta.get('backends')}`", f"world sizes: `{meta.get('world_sizes')}`"]
    if meta.get("debug_levels") not in (None, "", "OFF"):
        facts.append(f"debug levels: `{meta['debug_levels']}`")
    if meta.get("inits") not in (None, "", "lazy"):
        facts.append(f"init: `{meta['inits']}`")
    if any(r.rpc_agent for r in records):
        facts.append(f"RPC agents: `{meta.get('rpc_agents')}`")
    plugins = meta.get("plugins") or []
    facts.append(f"plugins: `{(', '.join(map(str, plugins)) if isinstance(plugins, list) else str(plugins)) or '-'}`")
    if meta.get("torch_version"):
        facts.append(f"torch {meta['torch_version']}")
    facts += [f"wall time: {meta.get('wall_seconds')} s", f"pytest exit status: {meta.get('exit_status')}"]
    counts = views.totals(records)
    total = ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts.get(o))
    lines = [_title(counts), "", " · ".join(facts), "", f"{len(records)} cases: {total}", ""]
    for why in meta.get("left_out") or []:  # a default form's share: cases that did not run are not passes
        lines += [f"Left out by default: {why}.", ""]
    not_in_effect = meta.get("debug_levels_not_in_effect") or views.levels_not_in_effect(records)
    if not_in_effect:  # these worlds' cases ran at no level they claim: said before any count of them
        lines += ["Debug levels not in effect (their cases ran unchecked by torch's wrapper):"]
        lines += [f"- {world}: {cell(why, 300)}" for world, why in not_in_effect.items()] + [""]
    return lines


def _title(counts: dict) -> str:
    """The first line; it says so plainly when no case ran (every one skipped, or none collected)."""
    ran = sum(n for outcome, n in counts.items() if outcome != "skipped")
    if ran:
        return "# distconform summary"
    skipped = counts.get("skipped", 0)
    why = f"every case skipped: {plural(skipped, 'case')}, reasons under Skipped" if skipped else "no case collected"
    return f"# distconform summary: NOTHING RAN ({why})"


def _matrix(records) -> list[str]:
    targets, areas, cells = views.matrix(records)
    out = ["| backend | area | " + " | ".join(OUTCOMES) + " |", "|---|---|" + "---|" * len(OUTCOMES)]
    for t in targets:
        for area in areas:
            if (t, area) in cells:
                counts = cells[(t, area)]
                out.append(f"| {t} | {area} | " + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES) + " |")
    return out + [""]


# How many entries each section shows: the worst few, the rest counted. summary.md stays the size of a
# terminal page whatever the number of cases or findings (tests/test_reports.py holds it under 12 KB);
# every entry is in report.html and conformance.json.
SHOWN = {"causes": 5, "failing": 8, "gaps": 8, "unstable": 6, "steady": 3, "findings": 3, "skips": 3, "slowest": 3, "faults": 8}


def _more(total: int, shown: int, what: str) -> list[str]:
    return [f"… and {total - shown} more {what}: report.html"] if total > shown else []


def _verdict(records) -> list[str]:
    """One line a person reads first: did the backend hold the contract, and what else to look at."""
    failing = views.failures(records)
    gaps = views.gaps(records)
    found = views.stability(records)
    parts = []
    if failing:
        causes = views.failures_by_cause(records)
        parts.append(f"{plural(len(failing), 'case')} failed ({plural(len(causes), 'cause')})")
    if found is not None and found.unstable:
        parts.append(f"{plural(len(found.unstable), 'clause')} varied over {found.repeats} runs")
    if gaps:
        parts.append(f"{plural(len(gaps), 'known gap')} shown in {plural(sum(len(g.cases) for g in gaps), 'case')}")
    ran = sum(1 for r in records if r.outcome != "skipped")
    if failing:
        word = "FAIL"
    elif found is not None and any(u.kind == "contract" for u in found.unstable):
        word = "UNSTABLE"
    elif ran:
        word = "PASS"
    else:
        return []
    return [f"**Verdict: {word}** · " + ("; ".join(parts) if parts else "every case that ran held the contract"), ""]


def _failures(records) -> list[str]:
    failing = views.failures(records)
    if not failing:
        return []
    causes = views.failures_by_cause(records)
    out = [f"## Failures: {plural(len(failing), 'case')}, {plural(len(causes), 'cause')}", "",
           "| cases | cause (the ranks' own exception) | clauses |", "|---|---|---|"]
    for group in causes[: SHOWN["causes"]]:
        clauses = group.clauses
        shown = "; ".join(cell(c, 50) for c in clauses[:2]) + (f" (+{len(clauses) - 2})" if len(clauses) > 2 else "")
        out.append(f"| {len(group.cases)} | {cell(group.cause, 160)} | {shown} |")
    out += _more(len(causes), SHOWN["causes"], "causes")
    out += ["", "Failing cases (repeats of a case on one line):", ""]
    rows = views.failing_cases(records)
    for area, clause, key, runs in rows[: SHOWN["failing"]]:
        bad = [r for r in runs if r.outcome in views.BAD]
        times = f" in {len(bad)} of {len(runs)} runs" if len(runs) > 1 else ""
        out.append(f"- **{area}** · {cell(clause, 70)} `{views.case_id(key)}` {bad[0].outcome}{times}: "
                   f"{cell(views.failure_line(bad[0]), 140)}")
    return out + _more(len(rows), SHOWN["failing"], "failing cases") + [""]


def _gaps(records, meta: dict) -> list[str]:
    groups = views.gaps(records)
    if not groups:
        return []
    cases = sum(len(g.cases) for g in groups)
    # under --repeat a gap is a non-strict xfail (fixtures/repeat.py): a gap that shows only sometimes is a
    # Stability finding, not a failure
    how = "xfail, not strict under --repeat" if meta.get("repeat") else "strict xfail"
    out = [f"## Known gaps: {len(groups)}, shown in {plural(cases, 'case')} ({how}: the case ran and showed "
           "the gap); most cases first", "",
           "| whose | gap | cases | where | actual behaviour (first case) |", "|---|---|---|---|---|"]
    for g in sorted(groups, key=lambda g: -len(g.cases))[: SHOWN["gaps"]]:
        out.append(f"| {cell(', '.join(g.owners), 40)} | {cell(g.reason, 110)} | {len(g.cases)} | "
                   f"{cell(', '.join(g.targets), 40)} | {cell(g.behaviour, 90) or '-'} |")
    return out + _more(len(groups), SHOWN["gaps"], "gaps") + [""]


def _stability(records) -> list[str]:
    found = views.stability(records)
    if found is None:
        return []
    varied = (f"{found.varied_cases} varied, in {plural(len(found.unstable), 'clause')}" if found.unstable
              else "none varied")
    out = [f"## Stability: {found.repeats} runs of each of {plural(found.cases, 'case')} (--repeat), {varied}", ""]
    if not found.unstable:
        out.append(f"Every case gave the same verdict in all {found.repeats} runs.")
    for u in found.unstable[: SHOWN["unstable"]]:
        counts = ", ".join(f"{n} {o}" for o, n in sorted(u.outcomes.items(), key=lambda kv: -kv[1]))
        out.append(f"- **{u.area}** · {cell(u.clause.rstrip('. '), 90)} — {u.verdict} ({counts}; "
                   f"`{views.case_id(u.cases[0].key)}`"
                   + (f" +{len(u.cases) - 1}" if len(u.cases) > 1 else "") + ")")
        for text, n in u.errors[:2]:
            out.append(f"  - {n}×: {cell(text, 140)}")
    out += _more(len(found.unstable), SHOWN["unstable"], "varied clauses")
    if found.steady:
        out += ["", f"Declared intermittent, never varied in {found.repeats} runs:", ""]
        out += [f"- **{s.area}** · {cell(s.clause.rstrip('. '), 90)} — {s.verdict}" for s in found.steady[: SHOWN["steady"]]]
        out += _more(len(found.steady), SHOWN["steady"], "steady intermittent gaps")
    return out + [""]


def _findings(records) -> list[str]:
    """Findings are measurements, not verdicts: counted here, the clauses with the most cases named."""
    groups = views.findings_by_clause(records)
    if not groups:
        return []
    cases = {r.nodeid for g in groups for r in g.cases}
    clauses = sorted({(g.area, g.clause) for g in groups})
    out = [f"## Findings: {len(groups)} distinct in {plural(len(cases), 'case')} of "
           f"{plural(len(clauses), 'clause')}; every one in report.html", ""]
    for g in sorted(groups, key=lambda g: -len(g.cases))[: SHOWN["findings"]]:
        out.append(f"- {g.area} · {cell(g.clause, 60)} ({plural(len(g.cases), 'case')}): {cell(g.folded.text, 120)}")
    return out + [""]


def _faults(records) -> list[str]:
    """Network faults (suites/faults): per fault, target and operation, how long the ranks took to learn of it."""
    figures, problems = fault_figures(records)
    if not figures and not problems:
        return []
    out = [f"## Faults: {plural(len(figures), 'operation')} under a fault, the slowest to detect it first", "",
           "| fault | target | ws | operation | outcome | detected after | × timeout | first error |",
           "|---|---|---|---|---|---|---|---|"]
    for f in figures[: SHOWN["faults"]]:
        detect = f"{f.detect_s:.2f} s" if f.detect_s is not None else "-"
        ratio = f"{f.ratio:.2f}" if f.ratio is not None else "-"
        out.append(f"| {f.fault} | {f.target} | {f.world_size} | {f.operation} | {f.outcome} | {detect} | "
                   f"{ratio} | {cell(f.error, 90) or '-'} |")
    out += _more(len(figures), SHOWN["faults"], "operations under a fault")
    out += [f"- unreadable figure: {cell(p, 140)}" for p in problems[:3]]
    return out + [""]


def _skips(records) -> list[str]:
    rows = views.skips(records)
    if not rows:
        return []
    total = sum(count for _, _, count in rows)
    out = [f"## Skipped: {plural(total, 'case')}, {plural(len(rows), 'reason')}", ""]
    for reason, targets, count in rows[: SHOWN["skips"]]:
        out.append(f"- {count}: {cell(reason, 140)} ({cell(', '.join(targets), 60)})")
    return out + _more(len(rows), SHOWN["skips"], "reasons") + [""]


def _timing(records, meta: dict) -> list[str]:
    """Where the time went, in a few lines: the sum, and the slowest clauses (every area's in report.html)."""
    if not records:
        return []
    summed = sum(r.duration for r in records)
    wall = meta.get("wall_seconds")
    out = ["## Where the time went", "",
           f"Case durations add up to {summed:.1f} s" + (f" in {wall} s of wall time" if wall else "")
           + " (pytest-xdist workers overlap cases). The slowest clauses:", ""]
    for c in views.slowest_clauses(records, SHOWN["slowest"]):
        out.append(f"- {c.total:.1f} s, {plural(c.cases, 'case')}: {c.area} · {cell(c.clause, 80)} "
                   f"(slowest `{views.case_id(c.slowest.nodeid)}` {c.slowest.duration:.2f} s)")
    return out + [""]


def render(records, meta: dict) -> str:
    out = _header(records, meta) + _verdict(records) + _matrix(records)
    out += _failures(records) + _stability(records) + _gaps(records, meta)
    out += _faults(records) + _findings(records) + _skips(records) + _timing(records, meta)
    out.append("Every case, finding, rank text, timing and profile: `report.html` and `conformance.json` beside "
               "this file.")
    return "\n".join(out) + "\n"


def write_markdown(path: str, records, meta: dict) -> None:
    with open(path, "w") as fh:
        fh.write(render(records, meta))
