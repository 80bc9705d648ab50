"""Where a gallery run's failures came from: each failed case's exceptions with their frames, written and read back.

The report files (conformance.json, junit.xml) keep a failure's first lines,
not its traceback, so they cannot say whether a case failed in its clause's
check or because the bug's own module raised. The gallery's run plugin
(tests/gallery_plugin.py) records, for every failed case of a bug's backend,
each exception of the failure (the local one and its cause chain; for a
failure relayed from ranks, each rank's exceptions, parsed from the traceback
the rank sent) with the frames it passed through. tests/gallery_verdict.py
judges them. This module only holds the records and their text form: it runs
in the run's pytest process and in the gallery's, and imports neither side.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

# A TypeError raised calling a function with the wrong arguments has no frame in that function (it never ran):
# its message names the function instead, "RecordsHistory._submit() takes from 4 to 5 positional arguments ...".
SIGNATURE_MISMATCH = re.compile(r"^(?P<qualname>[A-Za-z_][\w.]*)\(\) (?:takes|got|missing)\b")
_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_CHAIN_SEPARATORS = ("The above exception was the direct cause of the following exception:",
                     "During handling of the above exception, another exception occurred:")


@dataclass(frozen=True)
class Raised:
    """One exception: its type, first message line, the frames it passed (outermost first), and, for a
    signature mismatch, the file of the function it failed to call ('' otherwise or when not found)."""

    exc_type: str
    message: str
    frames: tuple[str, ...]  # file paths only: the verdict asks which file an exception came from
    callee: str = ""

    @property
    def origins(self) -> tuple[str, ...]:
        """The files the exception came from: where it was raised (its innermost frame), and for a call with the
        wrong arguments the file of the function called, which it never entered."""
        return tuple(path for path in (self.frames[-1] if self.frames else "", self.callee) if path)


@dataclass(frozen=True)
class FailedCase:
    """A failed case (or a bug module that failed to import: ``when == "import"``, ``nodeid`` its module)."""

    nodeid: str
    backend: str
    when: str  # setup, call, teardown, or import
    raised: tuple[Raised, ...]  # the local exception and its causes, innermost-raised last
    ranks: tuple[tuple[Raised, ...], ...] = field(default=())  # per failed rank: its chain, as raised there

    def to_dict(self) -> dict:
        return {"nodeid": self.nodeid, "backend": self.backend, "when": self.when,
                "raised": [_raised_dict(r) for r in self.raised],
                "ranks": [[_raised_dict(r) for r in chain] for chain in self.ranks]}


def _raised_dict(raised: Raised) -> dict:
    return {"exc_type": raised.exc_type, "message": raised.message, "frames": list(raised.frames),
            "callee": raised.callee}


class NotAFailuresFile(ValueError):
    """The failures file is not what the run plugin writes; the message names the file and the problem."""


def _string(data: dict, key: str, where: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise NotAFailuresFile(f"{where}: {key!r} must be a string, not {value!r}")
    return value


def _raised_from(data: object, where: str) -> Raised:
    if not isinstance(data, dict):
        raise NotAFailuresFile(f"{where}: an exception must be an object, not {data!r}")
    frames = data.get("frames", [])
    if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
        raise NotAFailuresFile(f"{where}: 'frames' must be a list of file paths, not {frames!r}")
    return Raised(_string(data, "exc_type", where), _string(data, "message", where, ""), tuple(frames),
                  _string(data, "callee", where, ""))


def _chain_from(data: object, where: str) -> tuple[Raised, ...]:
    if not isinstance(data, list):
        raise NotAFailuresFile(f"{where}: an exception chain must be a list, not {data!r}")
    return tuple(_raised_from(item, where) for item in data)


def case_from_dict(data: object, where: str = "failures") -> FailedCase:
    """A FailedCase from its JSON form; anything else is NotAFailuresFile naming ``where`` and the problem."""
    if not isinstance(data, dict):
        raise NotAFailuresFile(f"{where}: a failed case must be an object, not {data!r}")
    ranks = data.get("ranks", [])
    if not isinstance(ranks, list):
        raise NotAFailuresFile(f"{where}: 'ranks' must be a list, not {ranks!r}")
    return FailedCase(_string(data, "nodeid", where), _string(data, "backend", where), _string(data, "when", where),
                      _chain_from(data.get("raised", []), where), tuple(_chain_from(r, where) for r in ranks))


def read_failures(path: str) -> list[FailedCase]:
    """The failed cases a run's plugin wrote to ``path`` (none when it wrote nothing: nothing failed)."""
    try:
        with open(path) as fh:
            document = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise NotAFailuresFile(f"{path}: {exc}") from None
    if not isinstance(document, list):
        raise NotAFailuresFile(f"{path}: must hold a list of failed cases, not {type(document).__name__}")
    return [case_from_dict(item, f"{path}[{index}]") for index, item in enumerate(document)]


def write_failures(path: str, cases: list[FailedCase]) -> None:
    with open(path, "w") as fh:
        json.dump([case.to_dict() for case in cases], fh, indent=1)


def chain_from_text(text: str) -> tuple[Raised, ...]:
    """The exceptions of a formatted traceback (traceback.format_exception's text, as a rank sends it), in order.

    Each block between the chain separators is one exception: its ``File``
    lines are its frames, and the first unindented line after them is its
    type and message. Text that is no traceback gives no exceptions.
    """
    blocks = [text]
    for separator in _CHAIN_SEPARATORS:
        blocks = [part for block in blocks for part in block.split(separator)]
    chain = []
    for block in blocks:
        lines = block.splitlines()
        frames = [(index, match["path"]) for index, line in enumerate(lines) if (match := _FRAME.match(line))]
        after = lines[frames[-1][0] + 1:] if frames else lines
        heads = [line for line in after if line.strip() and not line.startswith((" ", "\t", "Traceback ("))]
        if not heads:
            continue
        exc_type, _, message = heads[0].partition(": ")
        chain.append(Raised(exc_type.strip(), message.strip(), tuple(path for _, path in frames)))
    return tuple(chain)
