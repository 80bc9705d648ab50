"""``python -m <module>`` runs of the project's own tests, forked from a server that has torch imported.

``popen(cmd, ...)`` takes subprocess.Popen's arguments and returns a Popen (``run`` is subprocess.run over it): for
``[sys.executable, "-m", module, ...]`` whose environment is this process's own in everything but the variables a
run reads after start-up (``_per_run``), a fork of tests/harness_cases/warm_server.py that becomes that run (2.4 s
of CPU less per run of the suite, measured: 6.2 against 8.7 CPU-s for c10d's barrier clauses); for anything else
(a run given TORCH_CPP_LOG_LEVEL, say: torch reads it at import), or with DISTCONFORM_WARM_RUNS=0, or when the
server cannot start, an ordinary subprocess. The run is the same either way (tests/test_warm_runs.py): its own
pid (the suite's session tag and process checks key on it), process group with ``start_new_session``, directory,
environment, path, streams and exit status; only torch and pytest are already imported.

One server per process that asks (each pytest-xdist worker), started on first use and gone with that process
(it exits when its stdin, a pipe from here, reaches EOF); another if that process's environment changes.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_server.py")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(SERVER)))
SWITCH = "DISTCONFORM_WARM_RUNS"  # "0": every run starts a fresh interpreter (to compare, or to rule this out)
START_TIMEOUT_S = 120.0  # the server's own imports: about 3 s idle, much longer beside a loaded run


# Read when a process group is made or an extension built, never at import: tests that run rank-side code in their
# own process (a world's env, a simulated host's interface) or build native leave them set in a pytest-xdist worker.
RUNTIME = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MAX_JOBS",
           "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _per_run(name: str) -> bool:
    """Variables a run reads after start-up, so a run may differ from the server in them (everything else, torch's
    and the interpreter's settings included, must be the server's, or the run starts a fresh interpreter)."""
    return (name.startswith(("PYTEST_", "DISTCONFORM_")) or name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
            or name in RUNTIME)


def _fixed(env: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """What a run must share with the server it forks from: its environment but for the per-run variables."""
    return frozenset((k, v) for k, v in env.items() if not _per_run(k))


class _Server:
    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="dc-warm-")
        atexit.register(shutil.rmtree, self.folder, True)  # its socket and log; the server exits on its own
        self.path = os.path.join(self.folder, "socket")
        self.env = {k: v for k, v in os.environ.items() if not _per_run(k)}
        self.running = 0  # runs forked from it that have not been reaped: a server is stopped only without any
        self.log = open(os.path.join(self.folder, "server.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, SERVER, self.path], cwd=REPO_ROOT, env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        if b"ready" not in line:
            self.proc.kill()
            raise RuntimeError(f"the warm-run server did not start (log: {self.log.name})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """End the server as the end of this process would (its runs still going are killed)."""
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


# Servers by the environment they were started in, most recently used last: one, unless this process's own
# environment changes (a test that sets a variable for good: CI's workers saw COLUMNS, POOL_WARMED,
# TORCH_FR_BUFFER_SIZE; a new server's folder names them in its file "changed"). At most MAX_SERVERS: the least
# recently used one with no run going is stopped for a new one; runs forked from the others finish undisturbed.
MAX_SERVERS = 3
_servers: dict[frozenset[tuple[str, str]], _Server] = {}
_failed = False
_lock = threading.Lock()


def _server_for(env: Mapping[str, str]) -> _Server | None:
    """The server a run with ``env`` can fork from: one started in the same environment, started now when ``env``
    is this process's own (None: the run starts a fresh interpreter)."""
    global _failed
    key = _fixed(env)
    with _lock:
        server = _servers.get(key)
        if server is not None and server.alive():
            _servers[key] = _servers.pop(key)  # most recently used last
            return server
        if _failed or key != _fixed(os.environ):
            return None
        if server is not None:
            del _servers[key]  # dead: replaced below
        elif len(_servers) >= MAX_SERVERS:
            idle = [k for k, s in _servers.items() if s.running == 0]
            if not idle:
                return None
            _servers.pop(idle[0]).stop()
        try:
            _servers[key] = server = _Server()
            if len(_servers) > 1:  # why this process's runs needed another server: kept beside its log
                earlier = dict(list(_servers)[-2])
                changed = sorted(k for k in set(earlier) | set(server.env) if earlier.get(k) != server.env.get(k))
                with open(os.path.join(server.folder, "changed"), "w") as fh:
                    fh.write(" ".join(changed) + "\n")
        except (OSError, RuntimeError) as exc:
            _failed = True
            print(f"tests/harness_cases/warm.py: {exc}; runs start fresh interpreters", file=sys.stderr)
            return None
        return server


class WarmPopen(subprocess.Popen):
    """A Popen whose child the server forks: only how the child starts and how its exit is learnt differ
    (CPython's POSIX Popen: _execute_child, _internal_poll and _wait; the rest, pipes and communicate included,
    is Popen's own)."""

    def __init__(self, server: _Server, *args, **kwargs) -> None:
        self._server = server
        self._conn: socket.socket | None = None
        super().__init__(*args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):
        start_new_session = rest[5]  # after restore_signals, gid, gids, uid, umask (3.8 to 3.13)
        request = {"module": args[2], "args": list(args[3:]), "cwd": os.path.abspath(cwd or os.getcwd()),
                   "env": dict(env if env is not None else os.environ), "new_session": bool(start_new_session)}
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self._server.path)
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            reply = json.loads(conn.recv(1 << 16) or b"{}")
        except (OSError, ValueError) as exc:
            conn.close()
            raise OSError(f"the warm-run server did not start {args[2]}: {exc}") from exc
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        if "pid" not in reply:
            conn.close()
            raise OSError(f"the warm-run server did not start {args[2]}: {reply}")
        self.pid = reply["pid"]
        self._conn = conn
        self._server.running += 1

    def _exit_message(self, timeout: float | None) -> int | None:
        """The run's exit status, waiting up to ``timeout`` s for it (None: not yet)."""
        if self._conn is None:
            return self.returncode
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return None
        raw = self._conn.recv(1 << 16)
        self._conn.close()
        self._conn = None
        self._server.running -= 1
        # no message: the server died before reaping the run, which its death then killed (or orphaned)
        return json.loads(raw)["exit"] if raw else -signal.SIGKILL

    def _internal_poll(self, _deadstate=None, **_):
        if self.returncode is None:
            code = self._exit_message(0)
            if code is not None:
                self.returncode = code
        return self.returncode

    def _wait(self, timeout):
        if self.returncode is not None:
            return self.returncode
        code = self._exit_message(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.returncode = code
        return code


def popen(cmd: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen(cmd, **kwargs), forked warm where the run allows (module docstring)."""
    env = kwargs.get("env")
    eligible = (os.environ.get(SWITCH, "1") != "0" and len(cmd) >= 3 and cmd[0] == sys.executable
                and cmd[1] == "-m" and not kwargs.get("preexec_fn") and not kwargs.get("shell"))
    if eligible:
        server = _server_for(env if env is not None else os.environ)
        if server is not None:
            return WarmPopen(server, cmd, **kwargs)
    return subprocess.Popen(cmd, **kwargs)


def run(cmd: list[str], *, input: str | bytes | None = None, capture_output: bool = False,
        timeout: float | None = None, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, ...) over ``popen``: the same arguments, result and TimeoutExpired (the run killed)."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with popen(cmd, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        code = process.poll()
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)
