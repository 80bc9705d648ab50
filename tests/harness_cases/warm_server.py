"""A fork server for the project's own tests' ``python -m <module>`` runs: ``python tests/harness_cases/warm_server.py SOCKET``.

Most of ``pytest tests/`` is runs of the suite in subprocesses (the gallery's, the launch and report tests', tox
-e privateuse1's commands), and each used to spend about 3 s of CPU importing torch, pytest and their plugins
before its first case: 80 runs, some 250 of CI's CPU-seconds on a 2-core machine. This server imports them once;
a run is a fork of it that then becomes ``python -m <module> <args>`` (runpy, as the interpreter's ``-m`` does)
in the run's own working directory, environment and standard streams, and exits the way an interpreter does
(SystemExit through the stack: atexit handlers, non-daemon threads, flushed streams). tests/harness_cases/warm.py
is the client: it sends only runs whose environment matches this server's in everything read when torch is
imported, and starts any other run the ordinary way.

Run as a script, not as a module, so that no package of the project is imported here: a run imports the
project's modules itself, fresh, with pytest's assertion rewriting as in any run.

Protocol: a Unix SEQPACKET socket at SOCKET; one connection per run. The client sends one message, a JSON
request ``{"module", "args", "cwd", "env", "new_session"}`` with three descriptors attached (the run's stdin,
stdout and stderr); the server answers ``{"pid": N}`` once forked and ``{"exit": CODE}`` (Popen-style: minus the
signal number for a signal) once it has reaped the run. The server exits when its stdin reaches EOF (the client
process ended: its end of the pipe closed), after killing the runs still going.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

# What every run of the suite imports before its first case (measured: the third-party top-level modules of a
# collection of suites/), so that the fork inherits them imported; not pytest's plugins (xdist, pytest_timeout,
# hypothesis and its plugin): pytest marks those for assertion rewriting at start-up and warns, in every run, of
# each it finds already imported ("Module already imported so cannot be rewritten"). Together 0.1 s of a run.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.rpc", "torch.distributed.algorithms.join", "numpy",
           "pytest", "_pytest.pytester", "jinja2", "execnet", "pygments", "pygments.lexers", "pygments.formatters")


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional plugin this venv lacks: the run imports what it has, as it would anyway


def _become(request: dict, fds: list[int], closing: list[socket.socket]) -> None:
    """In the forked child: take the run's streams, directory, environment and path, then run its module as
    ``python -m`` would. Returns only by raising SystemExit (the run's exit status)."""
    for sock in closing:
        sock.close()
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    # sys.path as `python -m` builds it: the working directory, then PYTHONPATH, then the interpreter's own
    ours = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]
    sys.path[:] = [request["cwd"], *ours, *base]
    import importlib
    import runpy

    importlib.invalidate_caches()
    sys.argv = [request["module"], *request["args"]]  # runpy sets argv[0] to the module's file, as -m does
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass  # the client gave up on this run (its test ended): nothing is waiting for the answer


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    runs: dict[int, socket.socket] = {}  # pid -> the connection that asked for it
    stdin = sys.stdin.fileno()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    while True:
        readable, _, _ = select.select([listener, stdin], [], [], 0.05)
        while runs:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = runs.pop(pid, None)
            if conn is not None:
                _send(conn, {"exit": _status(wait_status)})
                conn.close()
        if stdin in readable and not os.read(stdin, 4096):
            break  # the client process is gone
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(message)
        except (OSError, ValueError) as exc:
            _send(conn, {"error": f"bad request: {exc}"})
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            _become(request, fds, [listener, conn, *runs.values()])
        for fd in fds:
            os.close(fd)
        runs[pid] = conn
        _send(conn, {"pid": pid})
    for pid in runs:
        try:
            os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


_SERVER_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]

if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/harness_cases/warm_server.py SOCKET")
    _preload()
    try:
        # setproctitle finds the memory a title is written to through the environment's first strings, which a
        # run's _become replaces: found here, so that a run's zygote, a fork of it, can still show its session tag
        # in its title (fixtures/zygote.py; without one it starts a fresh interpreter instead)
        import setproctitle

        setproctitle.getproctitle()
    except ImportError:
        pass
    serve(sys.argv[1])
