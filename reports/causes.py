"""The cause of a failure, and the key that groups failures with the same cause.

A backend author fixes causes, not rows. When a function raises on ranks,
the harness wraps the ranks' exceptions in a ``RankError`` whose first line
("all_to_all_list raised on ranks [0, 1] of world ...") says where, not why.
The cause is the ranks' own exception type and message, with the ranks that
raised it; for a rank that died it is the signal and the last ``what():`` the
C++ runtime printed; for a hang, what the ranks' flight recorders say ("hang:
rank 1 never entered all_reduce #17 of group default_pg; rank 0 waits in it"). The harness's wrapper text follows it in every report.

Failures are grouped by a key: the cause with ranks, numbers, addresses and
temporary paths normalised away, so "expected (1), got (3)" and "expected (2),
got (5)" are one cause.
"""

from __future__ import annotations

import re

from .folding import fold, ranks_text

_HEX = re.compile(r"0x[0-9a-fA-F]{4,}")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_RANKS_SUFFIX = re.compile(r" \((?:rank|ranks) [\d, ]+\)")
_WRAPPER = re.compile(r"^(?:fixtures\.errors\.)?RankError: .* raised on ranks \[[\d, ]*\] of world [^:]+:$")
_RANK_LINE = re.compile(r"^--- rank (\d+): (.+)$")
_CPP_WHAT = re.compile(r"^\s*what\(\):\s*(.+)$")
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_LIMIT = 300


def _clip(text: str, limit: int = _LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _group_by_line(lines_by_rank: dict[int, str]) -> str:
    """'RuntimeError: x (ranks 0, 1)': ranks whose lines differ only in numbers fold into one part
    (differing numbers as ranges); parts that differ otherwise are joined by '; '."""
    texts = [f"rank {rank}: {line}" for rank, line in sorted(lines_by_rank.items())]
    parts = []
    for entry in fold(texts):
        prefix = ranks_text(entry.ranks) + ": "
        line = entry.text[len(prefix):] if entry.text.startswith(prefix) else entry.text
        parts.append(f"{_clip(line)} ({ranks_text(entry.ranks)})")
    return "; ".join(parts)


def cause_of_exception(exc: BaseException | None) -> str:
    """The cause line of a harness exception; '' when the exception is its own cause."""
    if exc is None:
        return ""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:  # fixtures.errors.RankError
        return _group_by_line({rank: f.first_line() for rank, f in failures.items()})
    if type(exc).__name__ == "RankDied":
        return _death_cause(str(exc))
    summary = getattr(exc, "hang_summary", "")  # fixtures.errors.DeadlineExceeded, from the flight recorder
    if summary:
        return _clip(f"hang: {summary}")
    return ""


def _death_cause(message: str) -> str:
    """'rank 0 died (killed by signal 6 (SIGABRT)): gloo::EnforceNotMet: [enforce fail ...] ...'."""
    lines = message.splitlines()
    head = lines[0] if lines else message
    died = re.match(r"^(rank \d+) of world \S+ (died \(.*\)) while running", head)
    summary = f"{died.group(1)} {died.group(2)}" if died else head
    thrown = next((m.group(1) for m in map(_TERMINATE.search, lines) if m), "")
    what = next((m.group(1) for m in map(_CPP_WHAT.match, lines) if m), "")
    if what:
        return _clip(f"{summary}: {thrown + ': ' if thrown else ''}{what}")
    return _clip(summary)


def cause_of_text(error: str) -> str:
    """The cause recovered from recorded error text (records without a structured cause)."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return ""
    if _WRAPPER.match(lines[0]):
        per_rank = {int(m.group(1)): m.group(2) for m in map(_RANK_LINE.match, lines[1:]) if m}
        if per_rank:
            return _group_by_line(per_rank)
    if "RankDied: " in lines[0]:
        return _death_cause("\n".join([lines[0].split("RankDied: ", 1)[1]] + lines[1:]))
    return _clip(lines[0])


def with_cause(cause: str, error: str) -> str:
    """Error text whose first line is the cause and whose rest is the harness's own text."""
    first = next((line.strip() for line in (error or "").splitlines() if line.strip()), "")
    if not cause or first.startswith(cause) or _clip(first) == cause:
        return error
    return f"{cause}\n{error}" if error else cause


def cause_key(cause: str) -> str:
    """Normalised cause for grouping: rank lists, numbers and addresses do not make a new cause."""
    key = _RANKS_SUFFIX.sub("", cause)
    key = _HEX.sub("0x…", key)
    key = re.sub(r"/tmp/\S+", "/tmp/…", key)
    return _NUMBER.sub("N", key)
