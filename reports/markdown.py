"""summary.md: what a backend author reads in a terminal, a page or two for a default run.

The backend x area table; failures grouped by cause (the ranks' own exception,
normalised: a backend author fixes causes, not rows), then one line per
failing case grouped by clause; one line per known gap with its case count;
findings one line per clause and distinct finding with their count; skip
reasons with counts. Everything per case (rank texts, timings, profiling)
is in report.html and conformance.json beside this file.
"""

from __future__ import annotations

from . import views
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


def _failures(records) -> list[str]:
    failing = views.failures(records)
    if not failing:
        return []
    causes = views.failures_by_cause(records)
    out = [f"## Failures: {plural(len(failing), 'case')}, {plural(len(causes), 'cause')}", "",
           "| cases | cause (the ranks' own exception) | clauses |", "|---|---|---|"]
    for group in causes:
        clauses = group.clauses
        shown = "; ".join(cell(c, 60) for c in clauses[:2]) + (f" (+{len(clauses) - 2})" if len(clauses) > 2 else "")
        out.append(f"| {len(group.cases)} | {cell(group.cause, 220)} | {shown} |")
    out += ["", "By clause (one line per case):", ""]
    for area, clause, cases in views.failures_by_clause(records):
        out.append(f"- **{area}** · {cell(clause, 200)} (`{cases[0].nodeid.split('[')[0]}`)")
        for r in cases:
            out.append(f"  - `{views.case_id(r.nodeid)}` {r.outcome}: {cell(views.failure_line(r), 200)}")
    return out + [""]


def _gaps(records) -> list[str]:
    groups = views.gaps(records)
    if not groups:
        return []
    out = ["## Known gaps (strict xfail: the case ran and showed the gap)", "",
           "| whose | gap | cases | where | actual behaviour (first case) |", "|---|---|---|---|---|"]
    for g in groups:
        out.append(f"| {cell(', '.join(g.owners), 60)} | {cell(g.reason, 140)} | {len(g.cases)} | "
                   f"{cell(', '.join(g.targets), 80)} | {cell(g.behaviour, 140) or '-'} |")
    return out + [""]


def _findings(records) -> list[str]:
    groups = views.findings_by_clause(records)
    if not groups:
        return []
    cases = {r.nodeid for g in groups for r in g.cases}
    out = [f"## Findings: {len(groups)} distinct, in {plural(len(cases), 'case')} (ranks and numbers folded)", "",
           "| area | clause | cases | finding |", "|---|---|---|---|"]
    for g in groups:
        out.append(f"| {g.area} | {cell(g.clause, 70)} | {len(g.cases)} | {cell(g.folded.text, 160)} |")
    return out + [""]


def _skips(records) -> list[str]:
    rows = views.skips(records)
    if not rows:
        return []
    out = ["## Skipped", "", "| cases | reason | backends |", "|---|---|---|"]
    for reason, targets, count in rows:
        out.append(f"| {count} | {cell(reason)} | {cell(', '.join(targets), 80)} |")
    return out + [""]


def _timing(records, meta: dict) -> list[str]:
    """Where the time went: per backend/agent and area, then the ten slowest clauses."""
    if not records:
        return []
    summed = sum(r.duration for r in records)
    wall = meta.get("wall_seconds")
    out = ["## Where the time went", "",
           f"Case durations add up to {summed:.1f} s" + (f" in {wall} s of wall time" if wall else "")
           + " (with pytest-xdist workers cases overlap, so the sum can exceed the wall time).", "",
           "| backend | area | cases | seconds | cases/s | slowest case |", "|---|---|---|---|---|---|"]
    for t in views.durations_by_area(records):
        out.append(f"| {t.target} | {t.area} | {t.cases} | {t.total:.1f} | {t.cases_per_s:.1f} | "
                   f"`{views.case_id(t.slowest.nodeid)}` {t.slowest.duration:.2f} s |")
    out += ["", "The ten slowest clauses (every parameter and backend together):", "",
            "| seconds | cases | area | clause | slowest case |", "|---|---|---|---|---|"]
    for c in views.slowest_clauses(records):
        out.append(f"| {c.total:.1f} | {c.cases} | {c.area} | {cell(c.clause, 90)} (`{c.function}`) | "
                   f"`{views.case_id(c.slowest.nodeid)}` {c.slowest.duration:.2f} s |")
    return out + [""]


def render(records, meta: dict) -> str:
    out = _header(records, meta) + _matrix(records)
    out += _failures(records) + _gaps(records) + _findings(records) + _skips(records) + _timing(records, meta)
    out.append("Every case, rank texts, timings and profiling: `report.html` and `conformance.json` beside this file.")
    return "\n".join(out) + "\n"


def write_markdown(path: str, records, meta: dict) -> None:
    with open(path, "w") as fh:
        fh.write(render(records, meta))
