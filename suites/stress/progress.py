"""Progress of a long benchmark run on a terminal: what runs now, how far along, what remains.

One status line on stderr, rewritten in place ("[23/90] gloo ws2 all_reduce 4 MiB · 2m10s
elapsed, about 6m left"), cleared before any other output (``say`` in common.py) so
tables stay clean. Quiet when stderr is not a terminal (a CI log keeps only the
tables) or when DISTCONFORM_PROGRESS=0; DISTCONFORM_PROGRESS=1 forces it on.

The estimate assumes the remaining steps cost what the finished ones did on average;
steps a run ends early (sizes over --max-seconds-per-size) are dropped from the
total with ``skip``.
"""

from __future__ import annotations

import os
import sys
import time

_ACTIVE: "Progress | None" = None


def clear_line() -> None:
    """Wipe the status line, if one is shown (called before anything else is printed)."""
    if _ACTIVE is not None:
        _ACTIVE.clear()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    def __init__(self, total: int, stream=None, enabled: bool | None = None, clock=time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        setting = os.environ.get("DISTCONFORM_PROGRESS", "")
        if enabled is None:
            enabled = setting == "1" or (setting != "0" and getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.total = max(0, total)
        self.done = 0
        self.clock = clock
        self.started = clock()
        self._shown = False
        self.label = ""

    def __enter__(self) -> "Progress":
        global _ACTIVE
        _ACTIVE = self if self.enabled else None
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        self.clear()
        _ACTIVE = None

    def status(self) -> str:
        elapsed = self.clock() - self.started
        text = f"[{min(self.done + 1, self.total)}/{self.total}] {self.label} · {_duration(elapsed)} elapsed"
        if self.done:
            remaining = elapsed / self.done * max(0, self.total - self.done)
            text += f", about {_duration(remaining)} left"
        return text

    def start(self, label: str) -> None:
        """A step begins: show what it is."""
        self.label = label
        if self.enabled:
            width = 200
            try:
                width = os.get_terminal_size(self.stream.fileno()).columns - 1
            except (AttributeError, OSError, ValueError):
                pass
            self.stream.write("\r\x1b[K" + self.status()[:width])
            self.stream.flush()
            self._shown = True

    def step(self, count: int = 1) -> None:
        """``count`` steps finished."""
        self.done += count

    def skip(self, count: int) -> None:
        """``count`` planned steps will not run (the estimate shrinks)."""
        self.total = max(self.done, self.total - count)

    def clear(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
