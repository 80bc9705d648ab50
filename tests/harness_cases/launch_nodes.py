"""Simulated nodes for the launch tests (tests/test_launch_*.py): fixtures/launch/ without a cluster.

Nodes are simulated: two torchrun invocations on this host (--nnodes 2
--node-rank 0/1, rendezvous on 127.0.0.1 at a port found by binding port 0),
each node's host name set by DISTCONFORM_HOSTNAME; srun and Open MPI tasks by
their variables. Failures are injected by tests/harness_cases/launch_cases.py
(LAUNCH_CASE=...). Every run proves that no process of it is left (they all
carry MARK_ENV).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

from fixtures.spawner import processes_with_env
from tests.harness_cases.procs import REPO_ROOT, command_line

MARK_ENV = "DISTCONFORM_LAUNCH_TEST"  # every process of one launched run carries it: proof none is left
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def ipv6_loopback() -> str:
    """'' if this host can listen and dial on ::1, else why not."""
    if not socket.has_ipv6:
        return "Python was built without IPv6"
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6) as server:
            socket.create_connection(("::1", server.getsockname()[1]), timeout=5).close()
    except OSError as exc:
        return f"no IPv6 loopback here (::1: {exc.strerror})"
    return ""


NO_IPV6 = ipv6_loopback()


NO_IPV6 = ipv6_loopback()


def connection_closed(conn) -> bool:
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        return True
    return False


# ------------------------------------------------------------- simulated nodes
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def marked_processes(mark: str) -> list[str]:
    """'pid: command line' of every live process of one launched run (they all carry its mark)."""
    return [f"{pid}: {command_line(pid)}" for pid in processes_with_env(MARK_ENV, mark)]


def run_nodes(commands: list[tuple[list[str], dict]], tmp_path, timeout: float = 400.0,
               during=None) -> list[tuple[int, str]]:
    """Start every command (one per simulated node or task), wait for all; prove none leaves a process."""
    mark = secrets.token_hex(8)
    procs = []
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "OMPI_", "PMI", "TORCHELASTIC",
                                 "DISTCONFORM_SESSION"))}
    try:
        for index, (argv, env) in enumerate(commands):
            out = open(tmp_path / f"node{index}.out", "w+")
            procs.append((subprocess.Popen(argv, cwd=REPO_ROOT, env={**base, **env, MARK_ENV: mark}, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True), out))
        if during is not None:
            during([proc for proc, _ in procs], mark)  # e.g. stop a node in the middle of the run
        end = time.monotonic() + timeout
        for proc, _ in procs:
            proc.wait(timeout=max(1.0, end - time.monotonic()))
        results = []
        for proc, out in procs:
            out.seek(0)
            results.append((proc.returncode, out.read()))
        # every process of every "node" exits with its launcher (the supervisors' ranks included)
        end = time.monotonic() + 15
        while marked_processes(mark) and time.monotonic() < end:
            time.sleep(0.2)
        assert marked_processes(mark) == []
        return results
    finally:
        for proc, out in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.close()
        for line in marked_processes(mark):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def two_torchrun_nodes(args: list[str], tmp_path, env=None, torchrun_args=(), during=None,
                        ) -> tuple[list[tuple[int, str]], dict]:
    port = free_port()
    report = tmp_path / "report"
    commands = []
    for node in (0, 1):
        argv = [*TORCHRUN, *torchrun_args, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(port),
                "-m", "fixtures.launch", *args, "-p", "no:cacheprovider", "--report-dir", str(report)]
        commands.append((argv, {"DISTCONFORM_HOSTNAME": f"node{node}", **(env or {})}))
    results = run_nodes(commands, tmp_path, during=during)
    with open(report / "conformance.json") as fh:
        cases = {c["nodeid"]: c for c in json.load(fh)["cases"]}
    return results, cases


def junit_failure(tmp_path, name: str) -> str:
    import xml.etree.ElementTree as ET

    for case in ET.parse(tmp_path / "report" / "junit.xml").iter("testcase"):
        if case.get("name") == name:
            text = "".join(f.text or "" for f in case.iter("failure"))
            # pytest's "E   " margin off, so the text reads as the exception's message
            return "\n".join(line[1:].strip() if line.startswith("E ") else line.strip() for line in text.splitlines())
    raise AssertionError(f"{name} not in junit.xml")


def outcomes(cases: dict) -> dict:
    return {nodeid: c["outcome"] for nodeid, c in cases.items()}


def single_host_cases(args: list[str], tmp_path) -> dict:
    """The same pytest arguments run on one host at world size 4 (it must pass): its cases by nodeid."""
    single = subprocess.run([sys.executable, "-m", "pytest", *args, "--world-size", "4", "-p", "no:cacheprovider",
                             "--report-dir", str(tmp_path / "single")],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert single.returncode == 0, single.stdout[-3000:]
    with open(tmp_path / "single" / "conformance.json") as fh:
        return {c["nodeid"]: c for c in json.load(fh)["cases"]}


def run_tasks(env_of, n: int, tmp_path, args=("tests/harness_cases/launch_cases.py", "-k", "placement")):
    report = tmp_path / "report"
    commands = [([sys.executable, "-m", "fixtures.launch", *args, "-p", "no:cacheprovider", "--report-dir", str(report)],
                 env_of(rank)) for rank in range(n)]
    results = run_nodes(commands, tmp_path, timeout=300)
    with open(report / "conformance.json") as fh:
        return results, {c["nodeid"]: c["outcome"] for c in json.load(fh)["cases"]}
