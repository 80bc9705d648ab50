"""suites/stress/progress.py: a status line on a terminal, nothing in a CI log."""

import io

from suites.stress import progress
from suites.stress.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_terminal_shows_the_step_and_an_estimate_of_what_remains(monkeypatch):
    monkeypatch.delenv("DISTCONFORM_PROGRESS", raising=False)
    now = [100.0]
    out = Terminal()
    with Progress(4, stream=out, clock=lambda: now[0]) as bar:
        bar.start("gloo ws2 all_reduce 8 B")
        assert out.getvalue().endswith("[1/4] gloo ws2 all_reduce 8 B · 0s elapsed")
        now[0] += 30
        bar.step()
        bar.start("gloo ws2 all_reduce 32 B")
        assert out.getvalue().endswith("[2/4] gloo ws2 all_reduce 32 B · 30s elapsed, about 1m30s left")
        bar.skip(2)  # the larger sizes will not run: the estimate shrinks
        bar.start("gloo ws2 all_reduce 32 B")
        assert out.getvalue().endswith("[2/2] gloo ws2 all_reduce 32 B · 30s elapsed, about 30s left")
        progress.clear_line()  # what say() does before printing a table row
        assert out.getvalue().endswith("\r\x1b[K")
    assert progress._ACTIVE is None


def test_a_ci_log_stays_quiet_unless_asked(monkeypatch):
    monkeypatch.delenv("DISTCONFORM_PROGRESS", raising=False)
    log = io.StringIO()  # not a terminal
    with Progress(3, stream=log) as bar:
        bar.start("gloo ws2 all_reduce 8 B")
        bar.step()
    assert log.getvalue() == ""
    monkeypatch.setenv("DISTCONFORM_PROGRESS", "1")
    forced = io.StringIO()
    with Progress(3, stream=forced) as bar:
        bar.start("x")
    assert "[1/3] x" in forced.getvalue()
    monkeypatch.setenv("DISTCONFORM_PROGRESS", "0")
    off = Terminal()
    with Progress(3, stream=off) as bar:
        bar.start("x")
    assert off.getvalue() == ""
