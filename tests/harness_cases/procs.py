"""Process helpers for the harness's own tests: find rank processes, run pytest in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from fixtures.zygote import REPO_ROOT, SERVER_TITLE, SESSION_ENV
from tests.harness_cases import warm

# How a zygote shows in its command line: its title, or the module a fresh one runs without setproctitle. Its ranks
# are titled RANK_TITLE (without setproctitle they show the zygote's command line).
ZYGOTE_NAMES = (SERVER_TITLE, "fixtures.zygote")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _cmdline(pid: int) -> list[str]:
    return [part.decode(errors="replace") for part in _read(f"/proc/{pid}/cmdline").split(b"\0") if part]


def command_line(pid: int) -> str:
    return " ".join(_cmdline(pid))


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None if it is gone."""
    raw = _read(f"/proc/{pid}/stat").decode(errors="replace")
    try:
        fields = raw.rsplit(")", 1)[1].split()  # the command name may contain spaces
        return fields[0], int(fields[1])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def session_of(pid: int) -> str:
    """The distconform session a process belongs to ('' if none): the ``--session`` argument of
    its command line (a launcher's, or the title of a zygote or of a rank it forked: setproctitle
    writes the title as one string, so the line is split at spaces too), or DISTCONFORM_SESSION
    in its environment (a fresh zygote's and its ranks' without setproctitle)."""
    args = command_line(pid).split()
    if "--session" in args and args.index("--session") + 1 < len(args):
        return args[args.index("--session") + 1]
    needle = f"{SESSION_ENV}=".encode()
    for item in _read(f"/proc/{pid}/environ").split(b"\0"):
        if item.startswith(needle):
            return item[len(needle):].decode(errors="replace")
    return ""


def session_processes(prefix="distconform-") -> dict[int, str]:
    """Live processes (pid -> command line) whose session tag starts with ``prefix`` (a str or a
    tuple of them), except this one."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        if session_of(pid).startswith(prefix) and pid_alive(pid):
            found[pid] = " ".join(_cmdline(pid))
    return found


def rank_processes(prefix: str = "distconform-") -> dict[int, str]:
    """Session processes that are ranks: everything but the zygote (the per-session fork server).

    Needs setproctitle (requirements.txt): without it a forked rank shows its zygote's command line."""
    return {pid: cmd for pid, cmd in session_processes(prefix).items()
            if not any(name in cmd.split() for name in ZYGOTE_NAMES)}


def descends_from(pid: int, ancestor: int) -> bool:
    seen = 0
    while pid and pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        stat = _stat(pid)
        pid = stat[1] if stat else 0
        seen += 1
    return False


def alive_of(pids, timeout: float = 3.0) -> list[int]:
    """Those of ``pids`` still alive after up to ``timeout`` s (empty: all gone)."""
    end = time.monotonic() + timeout
    while True:
        left = [pid for pid in pids if pid_alive(pid)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


def wait_until_gone(prefix, timeout: float = 5.0) -> dict[int, str]:
    """Processes of sessions starting with ``prefix`` still alive after ``timeout`` s (empty: all gone)."""
    end = time.monotonic() + timeout
    while True:
        left = session_processes(prefix)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


@dataclass
class PytestRun:
    args: list
    report_dir: str
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    pid: int = 0
    seconds: float = 0.0
    # processes of a distconform session seen while the run was in flight: pid -> session tag
    seen: dict = field(default_factory=dict)

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr

    @property
    def session_tag_prefix(self) -> str:
        """What WorldPool (fixtures/spawner.session_tag) puts in front of every session tag of this (non-xdist) run."""
        return f"distconform-{self.pid}-"

    def report(self) -> dict:
        with open(os.path.join(self.report_dir, "conformance.json")) as fh:
            return json.load(fh)

    def cases(self) -> dict:
        return {case["nodeid"]: case for case in self.report()["cases"]}

    def read(self, name: str) -> str:
        with open(os.path.join(self.report_dir, name)) as fh:
            return fh.read()

    def survivors(self) -> dict[int, str]:
        """Session processes seen during the run that are still alive (same pid, same session)."""
        return {pid: tag for pid, tag in self.seen.items() if pid_alive(pid) and session_of(pid) == tag}


def _watch(run: PytestRun, proc: subprocess.Popen, stop: threading.Event) -> None:
    while not stop.is_set():
        for pid in session_processes():
            if pid in run.seen or pid == proc.pid:
                continue
            # read once and kept only if read: a process that ended since it was listed reads '' (its /proc entry
            # gone), which CI once recorded as a third session ({'', 'distconform-4189-...', 'distconform-4192-...'})
            tag = session_of(pid)
            if tag and descends_from(pid, proc.pid):
                run.seen[pid] = tag
        stop.wait(0.1)


def start_pytest(args, report_dir, *, watch: bool = False):
    """Start ``python -m pytest <args>`` from the repo root; finish it with ``finish_pytest``."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--report-dir", str(report_dir), *map(str, args)]
    env = dict(os.environ)
    for name in list(env):  # a clean pytest, even when this one runs under xdist
        if name in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST") or name.startswith("PYTEST_XDIST_"):
            del env[name]
    env.pop(SESSION_ENV, None)  # the run gets a session of its own
    run = PytestRun(args=cmd, report_dir=str(report_dir))
    started = time.monotonic()
    proc = warm.popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run.pid = proc.pid
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(run, proc, stop), daemon=True) if watch else None
    if watcher:
        watcher.start()
    return run, proc, stop, watcher, started


def finish_pytest(handle, timeout: float = 240.0) -> PytestRun:
    run, proc, stop, watcher, started = handle
    try:
        run.stdout, run.stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        run.stdout, run.stderr = proc.communicate()
        raise AssertionError(
            f"pytest run did not finish within {timeout} s: {run.args}\n{run.stdout}\n{run.stderr}") from None
    finally:
        stop.set()
        if watcher:
            watcher.join()
    run.returncode = proc.returncode
    run.seconds = time.monotonic() - started
    return run


def run_pytest(args, report_dir, *, watch: bool = False, timeout: float = 240.0) -> PytestRun:
    return finish_pytest(start_pytest(args, report_dir, watch=watch), timeout)
