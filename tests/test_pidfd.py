"""A rank's process handle signals that process or nothing, even once its pid number belongs to another process."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from fixtures.pidfd import ProcessRef

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _reuse(pid: int, attempts: int = 50) -> subprocess.Popen | None:
    """A new process with the number ``pid`` (root writes the last pid handed out; other processes may race)."""
    for _ in range(attempts):
        with open(NS_LAST_PID, "w") as fh:
            fh.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "30"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def test_a_handle_of_an_exited_process_never_signals_the_process_that_took_its_number():
    """SIGKILL through the handle of a dead rank leaves alone the new process now holding the same pid."""
    if os.geteuid() != 0 or not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip(f"needs root to write {NS_LAST_PID} (to hand a dead process's pid to a new one)")
    first = subprocess.Popen(["sleep", "30"])
    handle = ProcessRef(first.pid)
    assert handle.alive()
    first.kill()
    first.wait()  # reaped: its number is free
    assert not handle.alive()
    stranger = _reuse(first.pid)
    if stranger is None:
        pytest.skip(f"pid {first.pid} went to another process 50 times in a row (a busy machine)")
    try:
        assert handle.signal(signal.SIGKILL) is False
        handle.kill_group()
        assert stranger.poll() is None, "the handle killed the process that took its number"
    finally:
        stranger.kill()
        stranger.wait()
        handle.close()


def test_a_live_process_is_signalled_and_its_group_killed():
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    handle = ProcessRef(proc.pid)
    try:
        assert handle.signal(0) and handle.alive()
        handle.kill_group()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert handle.signal(signal.SIGKILL) is False
    finally:
        handle.close()
