"""The Jinja2 environment the HTML pages render with (report.html by reports/html_report.py,
diff.html by reports/diff.py): templates/, autoescaped (error texts and findings are backend
output and may hold anything), and the filters and helpers their templates share."""

from __future__ import annotations

import functools
import hashlib
import os

import jinja2

from . import views
from .folding import fold

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def anchor(*parts) -> str:
    """A fragment id that is stable for the same inputs and safe in any URL."""
    return "a" + hashlib.sha1("\x1f".join(map(str, parts)).encode()).hexdigest()[:12]


def seconds(value: float) -> str:
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.0f} ms" if value >= 0.001 else f"{value * 1e6:.0f} µs"


def number(value, digits: int = 3) -> str:
    """A figure for a table: 3 significant digits, '-' when missing."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value in (None, "") else str(value)
    return f"{value:.{digits}g}"


def size(value) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"


def first_line(text: str) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


@functools.cache
def environment() -> jinja2.Environment:
    """One environment per process: it keeps each compiled template (a compile costs about 60 ms of CPU, as much as
    a render; jinja2 still reloads a template whose file changed). Callers only read it."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(seconds=seconds, first_line=first_line, fold=fold, number=number, size=size)
    env.globals.update(anchor=anchor, case_anchor=lambda r: anchor("case", r.nodeid),
                       cases_anchor=lambda t, a: anchor("cases", t, a), case_id=views.case_id,
                       failure_line=views.failure_line, target=views.target, outcomes=views.OUTCOMES,
                       worst=views.worst)
    return env
