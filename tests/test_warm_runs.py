"""tests/harness_cases/warm.py: a run forked from the warm server is the run a fresh interpreter would be.

Same arguments (``-m`` semantics: argv[0] the module's file, ``__main__``), working directory, environment,
path, process group, streams and exit status, signals included; only torch is already imported. A run whose
environment differs from this process's in what torch reads at import starts a fresh interpreter; when this
process's own environment changes, a server started in the new one serves it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness_cases import warm

PROBE = [sys.executable, "-m", "tests.harness_cases.warm_probe"]


def _seen(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(autouse=True)
def no_servers(monkeypatch):
    """Each test starts from no servers (this worker's earlier tests may have left some, in other environments)."""
    monkeypatch.delenv(warm.SWITCH, raising=False)
    monkeypatch.setattr(warm, "_servers", {})
    monkeypatch.setattr(warm, "_failed", False)
    yield
    for server in warm._servers.values():
        server.stop()


@pytest.mark.parametrize("code", [0, 3])
def test_a_warm_run_sees_what_a_fresh_interpreter_sees(tmp_path, code):
    env = {**os.environ, "DISTCONFORM_WARM_PROBE": "x", "PYTHONPATH": os.pathsep.join([str(tmp_path), warm.REPO_ROOT])}
    kwargs = dict(cwd=warm.REPO_ROOT, env=env, input="line\n", capture_output=True, text=True, timeout=120)
    cold = subprocess.run([*PROBE, str(code)], **kwargs)
    hot = warm.run([*PROBE, str(code)], **kwargs)
    assert (hot.returncode, hot.stderr) == (cold.returncode, cold.stderr) == (code, "to stderr\n")
    seen_cold, seen_hot = _seen(cold), _seen(hot)
    assert (seen_cold.pop("torch_preloaded"), seen_hot.pop("torch_preloaded")) == (False, True)
    assert seen_hot == seen_cold
    assert seen_hot["argv0"] == "warm_probe.py" and seen_hot["main"] == "__main__" and seen_hot["stdin"] == "line"


def test_signals_sessions_and_timeouts_are_a_popens(tmp_path):
    killed = warm.run([*PROBE, str(-signal.SIGTERM)], cwd=warm.REPO_ROOT, input="", capture_output=True, text=True,
                      timeout=120)
    assert killed.returncode == -signal.SIGTERM
    proc = warm.popen([sys.executable, "-m", "http.server", "0"], cwd=str(tmp_path), stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL, start_new_session=True)
    assert isinstance(proc, warm.WarmPopen)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert os.getpgid(proc.pid) == proc.pid  # start_new_session: its own group, as killpg callers expect
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def again_server() -> str:
    return list(warm._servers.values())[-1].folder


def test_a_run_whose_torch_settings_differ_starts_a_fresh_interpreter(monkeypatch):
    same = warm.popen([*PROBE, "0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=warm.REPO_ROOT)
    assert isinstance(same, warm.WarmPopen) and same.wait(timeout=120) == 0
    for env in ({**os.environ, "TORCH_CPP_LOG_LEVEL": "INFO"}, {**os.environ, "OMP_NUM_THREADS": "7"}):
        proc = warm.popen([*PROBE, "0"], env=env, cwd=warm.REPO_ROOT, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, text=True)
        assert type(proc) is subprocess.Popen and json.loads(proc.communicate(timeout=120)[0])["torch_preloaded"] is False
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # this process's own environment changed: a server started in it
    again = warm.popen([*PROBE, "0"], cwd=warm.REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert isinstance(again, warm.WarmPopen) and json.loads(again.communicate(timeout=120)[0])["torch_preloaded"]
    assert (Path(again_server()) / "changed").read_text() == "OMP_NUM_THREADS\n"
    monkeypatch.setenv("MASTER_PORT", "1234")  # read when a group is made: the same server serves it
    same_server = warm.popen([*PROBE, "0"], cwd=warm.REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    assert isinstance(same_server, warm.WarmPopen) and same_server.wait(timeout=120) == 0
    assert len(warm._servers) == 2
    monkeypatch.setenv("COLUMNS", "99")  # a third environment, then a fourth: the least recently used server goes
    monkeypatch.setenv("POOL_WARMED", "1")
    for _ in range(2):
        monkeypatch.setenv("COLUMNS", str(int(os.environ["COLUMNS"]) + 1))
        run = warm.popen([*PROBE, "0"], cwd=warm.REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        assert isinstance(run, warm.WarmPopen) and run.wait(timeout=120) == 0
    assert len(warm._servers) == warm.MAX_SERVERS and all(server.running == 0 for server in warm._servers.values())
    monkeypatch.setenv(warm.SWITCH, "0")
    switched_off = warm.popen([*PROBE, "0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=warm.REPO_ROOT)
    assert type(switched_off) is subprocess.Popen and switched_off.wait(timeout=120) == 0
