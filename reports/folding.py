"""Fold findings that differ only in their rank and their numbers into one entry.

A clause records one finding per rank ("rank 0 raised after 0.51 s: X",
"rank 1 raised after 0.50 s: X"). Read per case, that is one fact: "ranks 0, 1
raised after 0.50–0.51 s: X". Texts fold when they are equal once the rank
they are about (the first "rank N") is set aside and every number is a slot;
a slot whose values differ shows their range. The original texts are kept
with the folded entry so nothing is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HEX = re.compile(r"0x[0-9a-fA-F]{4,}")
_SUBJECT = re.compile(r"\brank (\d+)\b")
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")


def ranks_text(ranks) -> str:
    """'rank 2', or 'ranks 0, 1, 3' (sorted)."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


@dataclass
class Folded:
    text: str  # the folded text: ranks grouped, differing numbers as ranges
    key: str  # the rank- and number-free skeleton the texts share
    ranks: list = field(default_factory=list)  # the ranks the texts were about (may be empty)
    originals: list = field(default_factory=list)  # every text folded into this entry

    @property
    def count(self) -> int:
        return len(self.originals)


def _split(text: str) -> tuple[str, int | None, list[str], list[str]]:
    """(key, subject rank, literal pieces, number pieces) of a text."""
    text = _HEX.sub("0x…", text)
    subject = _SUBJECT.search(text)
    rank = int(subject.group(1)) if subject else None
    if subject:
        text = text[: subject.start()] + "rank \0" + text[subject.end():]
    pieces = _NUMBER.split(text)
    literals, numbers = pieces[0::2], pieces[1::2]
    return "#".join(literals), rank, literals, numbers


def _span(values: list[str]) -> str:
    distinct = sorted(set(values), key=float)
    return distinct[0] if len(distinct) == 1 else f"{distinct[0]}–{distinct[-1]}"


def fold(texts) -> list[Folded]:
    """Fold texts (in their order of first appearance); each original lands in exactly one entry."""
    groups: dict[str, tuple[list, list, list]] = {}
    for text in texts:
        key, rank, literals, numbers = _split(text)
        _, numbers_by_slot, members = groups.setdefault(key, (literals, [[] for _ in numbers], []))
        for slot, value in enumerate(numbers):
            numbers_by_slot[slot].append(value)
        members.append((rank, text))
    out = []
    for key, (literals, numbers_by_slot, members) in groups.items():
        ranks = sorted({rank for rank, _ in members if rank is not None})
        parts = [literals[0]]
        for slot, values in enumerate(numbers_by_slot):
            parts += [_span(values), literals[slot + 1]]
        text = "".join(parts)
        if ranks:
            text = text.replace("rank \0", ranks_text(ranks), 1)
        out.append(Folded(text=text.replace("\0", ""), key=key.replace("\0", ""), ranks=ranks,
                          originals=[t for _, t in members]))
    return out
