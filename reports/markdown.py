"""summary.md: backend x area outcome table, then the findings behind it.

Findings are what a backend author reads: every failure with its first error
line, every known gap (xfail) with the backend's actual behaviour, and every
skip reason with how many cases it covers.
"""

from __future__ import annotations

from collections import Counter, defaultdict

COLUMNS = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")


def _one_line(text: str, limit: int = 160) -> str:
    line = next((l.strip() for l in (text or "").splitlines() if l.strip()), "")
    line = line.replace("|", "\\|")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _target(r) -> str:
    """The backend, and for an RPC clause the agent too (each agent gets its own rows)."""
    backend = r.backend or "-"
    return f"{backend} · rpc {r.rpc_agent}" if getattr(r, "rpc_agent", "") else backend


def render(records, meta: dict) -> str:
    out = ["# distconform summary", ""]
    out.append(f"backends: `{meta.get('backends')}` · world sizes: `{meta.get('world_sizes')}` · "
               f"plugins: `{meta.get('plugins') or '-'}` · wall time: {meta.get('wall_seconds')} s · "
               f"pytest exit status: {meta.get('exit_status')}")
    if any(getattr(r, "rpc_agent", "") for r in records):
        out.append("")
        out.append(f"RPC agents: `{meta.get('rpc_agents')}`")
    out.append("")

    table: dict = defaultdict(Counter)
    for r in records:
        table[(_target(r), r.area or "-")][r.outcome] += 1
    out.append("| backend | area | " + " | ".join(COLUMNS) + " |")
    out.append("|---|---|" + "---|" * len(COLUMNS))
    for (backend, area), counts in sorted(table.items()):
        out.append(f"| {backend} | {area} | " + " | ".join(str(counts.get(c, 0)) for c in COLUMNS) + " |")
    out.append("")

    failed = [r for r in records if r.outcome in ("failed", "error", "xpassed")]
    if failed:
        out += ["## Failures", "", "| case | clause | error |", "|---|---|---|"]
        for r in sorted(failed, key=lambda r: r.nodeid):
            out.append(f"| `{r.nodeid}` | {_one_line(r.clause)} | {_one_line(r.error)} |")
        out.append("")

    gaps = defaultdict(list)
    for r in records:
        if r.outcome == "xfailed":
            gaps[(_target(r), r.reason)].append(r)
    if gaps:
        out += ["## Known gaps (strict xfail: the case ran and the backend showed the gap)", "",
                "| backend | gap | cases | backend's actual behaviour (first case) |", "|---|---|---|---|"]
        for (backend, reason), cases in sorted(gaps.items()):
            out.append(f"| {backend} | {_one_line(reason)} | {len(cases)} | {_one_line(cases[0].error)} |")
        out.append("")

    findings = [r for r in records if r.findings]
    if findings:
        out += ["## Findings (what the backend did, as recorded by the clause)", "",
                "| case | outcome | finding |", "|---|---|---|"]
        for r in sorted(findings, key=lambda r: r.nodeid):
            for finding in r.findings:
                out.append(f"| `{r.nodeid}` | {r.outcome} | {_one_line(finding, 220)} |")
        out.append("")

    skips = Counter((r.backend, r.reason) for r in records if r.outcome == "skipped")
    if skips:
        out += ["## Skipped", "", "| backend | reason | cases |", "|---|---|---|"]
        for (backend, reason), count in sorted(skips.items()):
            out.append(f"| {backend or '-'} | {_one_line(reason)} | {count} |")
        out.append("")
    return "\n".join(out)


def write_markdown(path: str, records, meta: dict) -> None:
    with open(path, "w") as fh:
        fh.write(render(records, meta))
