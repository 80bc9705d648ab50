"""Compare two runs: what newly fails, what was fixed, gaps that appeared or closed, skips that changed,
duration regressions, and what differed in the runs' facts (torch, packages, environment).

    python -m reports.diff OLD NEW [--html FILE] [--slowdown PCT] [--min-seconds S] [--gate-durations]

OLD and NEW are report folders or conformance.json files. Markdown goes to
stdout. Exit status 1 when something regressed (a case newly failing, erroring
or passing a strict xfail, or a gap newly declared where the case passed), so
a CI job can gate on it; 2 on bad input. Duration regressions are listed but
gate only with ``--gate-durations``: timings on shared CI machines are noisy.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from . import views
from .causes import cause_key
from .json_report import read_json
from .rendering import environment

BAD = set(views.BAD)

# (kind, title, regression?) in the order the report shows them.
KINDS = (
    ("newly_failing", "Newly failing", True),
    ("gap_appeared", "Gaps that appeared (passed before, now a declared gap)", True),
    ("fixed", "Fixed (failed before, now passes or shows its declared gap)", False),
    ("gap_closed", "Gaps that closed (a strict xfail now passes, or the gap was removed and the case passes)", False),
    ("cause_changed", "Still failing, with another cause", False),
    ("skip_changed", "Skips that changed", False),
    ("added", "New cases", False),
    ("removed", "Cases no longer run", False),
)
REGRESSIONS = {kind for kind, _, regression in KINDS if regression}


@dataclass
class Change:
    kind: str
    old: object  # CaseRecord or None
    new: object  # CaseRecord or None

    @property
    def record(self):
        return self.new or self.old

    @property
    def detail(self) -> str:
        old, new = self.old, self.new
        if self.kind == "newly_failing":
            return f"{old.outcome if old else 'new'} → {new.outcome}: {views.failure_line(new)}"
        if self.kind == "fixed":
            return f"{old.outcome} → {new.outcome} (was: {views.failure_line(old)})"
        if self.kind == "gap_appeared":
            return f"{old.outcome} → xfailed: {new.reason}"
        if self.kind == "gap_closed":
            return f"{old.outcome} → {new.outcome} (gap was: {old.reason})"
        if self.kind == "cause_changed":
            return f"{views.failure_line(new)} (was: {views.failure_line(old)})"
        if self.kind == "skip_changed":
            before = f"skipped ({old.reason})" if old.outcome == "skipped" else old.outcome
            after = f"skipped ({new.reason})" if new.outcome == "skipped" else new.outcome
            return f"{before} → {after}"
        return self.record.outcome


@dataclass
class Slowdown:
    old: object
    new: object

    @property
    def ratio(self) -> float:
        return self.new.duration / self.old.duration if self.old.duration > 0 else float("inf")


@dataclass
class Comparison:
    old_meta: dict
    new_meta: dict
    changes: list = field(default_factory=list)
    slowdowns: list = field(default_factory=list)
    unchanged: int = 0

    def of(self, kind: str) -> list:
        return [c for c in self.changes if c.kind == kind]

    def regressed(self, gate_durations: bool = False) -> bool:
        return any(c.kind in REGRESSIONS for c in self.changes) or (gate_durations and bool(self.slowdowns))


def classify(old, new) -> str | None:
    """The kind of change from one record to the other (either may be None), or None if nothing changed."""
    if old is None:
        return "newly_failing" if new.outcome in BAD else "added"
    if new is None:
        return "removed"
    a, b = old.outcome, new.outcome
    if a == "xfailed" and b in ("xpassed", "passed"):
        return "gap_closed"  # a strict xfail that now passes: update the capability data
    if b in BAD and a not in BAD:
        return "newly_failing"
    if a in BAD and b not in BAD and b != "skipped":
        return "fixed"
    if b == "xfailed" and a == "passed":
        return "gap_appeared"
    if a in BAD and b in BAD and cause_key(views.failure_line(old)) != cause_key(views.failure_line(new)):
        return "cause_changed"
    if "skipped" in (a, b) and (a != b or old.reason != new.reason):
        return "skip_changed"
    return None


def compare(old_records, new_records, old_meta: dict, new_meta: dict, *, slowdown_pct: float = 50.0,
            min_seconds: float = 0.1) -> Comparison:
    old_by_id = {r.nodeid: r for r in old_records}
    new_by_id = {r.nodeid: r for r in new_records}
    result = Comparison(old_meta, new_meta)
    for nodeid in sorted(set(old_by_id) | set(new_by_id)):
        old, new = old_by_id.get(nodeid), new_by_id.get(nodeid)
        kind = classify(old, new)
        if kind:
            result.changes.append(Change(kind, old, new))
        else:
            result.unchanged += 1
        if (old and new and old.outcome == new.outcome == "passed" and new.duration - old.duration >= min_seconds
                and new.duration > old.duration * (1 + slowdown_pct / 100)):
            result.slowdowns.append(Slowdown(old, new))
    result.slowdowns.sort(key=lambda s: -(s.new.duration - s.old.duration))
    return result


def fact_changes(old: dict, new: dict) -> list[tuple[str, str, str]]:
    """[(fact, old value, new value)] for the run facts that differ (versions, env, host, options)."""
    def flat(meta: dict) -> dict:
        out = {}
        for key in ("torch_version", "python", "backends", "world_sizes", "rpc_agents", "debug_level",
                    "project_commit"):
            out[key] = str(meta.get(key, ""))
        for group in ("packages", "plugin_packages", "env"):
            values = meta.get(group)
            for name, value in (values.items() if isinstance(values, dict) else ()):
                out[f"{group}.{name}"] = str(value)
        host = meta.get("host")
        out["host"] = str(host.get("name", "")) if isinstance(host, dict) else str(host or "")
        return out

    a, b = flat(old), flat(new)
    return [(key, a.get(key, "(unset)"), b.get(key, "(unset)")) for key in sorted(set(a) | set(b))
            if a.get(key, "(unset)") != b.get(key, "(unset)")]


def grouped(changes) -> list[tuple[str, str, str, list]]:
    """[(area, clause, where, changes)]: per clause and target (backend, world size, agent)."""
    groups: dict = {}
    for c in changes:
        r = c.record
        groups.setdefault((r.area or "-", r.clause, views.column(r).label), []).append(c)
    return [(area, clause, where, items) for (area, clause, where), items in sorted(groups.items())]


def _cell(text: str, limit: int = 200) -> str:
    line = next((l.strip() for l in (text or "").splitlines() if l.strip()), "")
    return (line if len(line) <= limit else line[: limit - 1] + "…").replace("|", "\\|")


def render_markdown(cmp: Comparison, *, old_name: str, new_name: str, gate_durations: bool = False) -> str:
    verdict = "REGRESSED" if cmp.regressed(gate_durations) else "no regression"
    out = [f"# distconform: {new_name} vs {old_name}: {verdict}", ""]
    counts = [f"{len(cmp.of(kind))} {title.split(' (')[0].lower()}" for kind, title, _ in KINDS if cmp.of(kind)]
    out += [", ".join(counts + [f"{len(cmp.slowdowns)} slower", f"{cmp.unchanged} unchanged"]), ""]
    facts = fact_changes(cmp.old_meta, cmp.new_meta)
    if facts:
        out += ["## Run facts that differ", "", "| fact | old | new |", "|---|---|---|"]
        out += [f"| {key} | {_cell(a, 80)} | {_cell(b, 80)} |" for key, a, b in facts] + [""]
    for kind, title, _ in KINDS:
        changes = cmp.of(kind)
        if not changes:
            continue
        out += [f"## {title}: {len(changes)}", ""]
        for area, clause, where, items in grouped(changes):
            out.append(f"- **{area}** · {_cell(clause, 120)} · {where}: {len(items)} case{'s' if len(items) > 1 else ''}")
            if kind in ("added", "removed"):
                continue  # the count per clause says enough; the HTML page lists them
            for c in items[:10]:
                out.append(f"  - `{views.case_id(c.record.nodeid)}` {_cell(c.detail)}")
            if len(items) > 10:
                out.append(f"  - … and {len(items) - 10} more")
        out.append("")
    if cmp.slowdowns:
        out += [f"## Slower ({len(cmp.slowdowns)} cases{'' if gate_durations else '; not gating'})", "",
                "| old | new | ratio | case |", "|---|---|---|---|"]
        for s in cmp.slowdowns[:30]:
            out.append(f"| {s.old.duration:.3f} s | {s.new.duration:.3f} s | ×{s.ratio:.1f} | `{s.new.nodeid}` |")
        out.append("")
    return "\n".join(out)


def render_html(cmp: Comparison, *, old_name: str, new_name: str, gate_durations: bool = False) -> str:
    template = environment().get_template("diff.html.j2")
    return template.render(cmp=cmp, kinds=KINDS, grouped=grouped, facts=fact_changes(cmp.old_meta, cmp.new_meta),
                           old_name=old_name, new_name=new_name, regressed=cmp.regressed(gate_durations),
                           gate_durations=gate_durations)


def _load(path: str):
    file = os.path.join(path, "conformance.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
        raise ValueError(f"{path}: no conformance.json there (give a report folder or a conformance.json file)")
    return read_json(file)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.diff", description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the earlier run: a report folder or its conformance.json")
    parser.add_argument("new", help="the later run: a report folder or its conformance.json")
    parser.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    parser.add_argument("--slowdown", type=float, default=50.0, metavar="PCT",
                        help="a passing case is slower when it takes more than PCT%% longer (default: 50)")
    parser.add_argument("--min-seconds", type=float, default=0.1, metavar="S",
                        help="... and at least S seconds longer (default: 0.1)")
    parser.add_argument("--gate-durations", action="store_true", help="exit 1 on slower cases too")
    args = parser.parse_args(argv)
    try:
        old_records, old_meta = _load(args.old)
        new_records, new_meta = _load(args.new)
    except ValueError as exc:
        print(f"reports.diff: {exc}", file=sys.stderr)
        return 2
    cmp = compare(old_records, new_records, old_meta, new_meta, slowdown_pct=args.slowdown,
                  min_seconds=args.min_seconds)
    names = {"old_name": args.old, "new_name": args.new, "gate_durations": args.gate_durations}
    print(render_markdown(cmp, **names))
    if args.html:
        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(render_html(cmp, **names))
    return 1 if cmp.regressed(args.gate_durations) else 0


if __name__ == "__main__":
    sys.exit(main())
