"""Simulated nodes for the launch tests (tests/test_launch_*.py): fixtures/launch/ without a cluster.

Nodes are simulated: two torchrun invocations on this host (--nnodes 2
--node-rank 0/1, rendezvous on node 0's address at a port found by binding port 0),
each node's host name set by DISTCONFORM_HOSTNAME; srun and Open MPI tasks by
their variables. Where a node runs is the run's ``--hosts``: ``none``, every node
on this host's loopback (127.0.0.1); ``netns``, each node on a simulated host of
its own (fixtures/hosts: a network namespace with its own address on a bridge,
made for the run and removed with it), its processes started inside it and
picking its interface the way users do (``GLOO_SOCKET_IFNAME``...), so every
byte between nodes crosses the bridge. Failures are injected by
tests/harness_cases/launch_cases.py (LAUNCH_CASE=...). Every run proves that no
process of it is left (they all carry MARK_ENV).
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from fixtures.hosts import SimulatedHosts
from fixtures.spawner import processes_with_env
from tests.harness_cases.procs import REPO_ROOT, command_line
from tests.harness_cases import warm

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


def connection_closed(conn) -> bool:
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        return True
    return False


# ------------------------------------------------------------- simulated nodes
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SimulatedNode:
    """Where one simulated node runs: its address (what the other nodes dial), what goes before a command to
    start it there, and the variables that make its ranks use that address."""

    index: int
    address: str = LOOPBACK
    exec_prefix: tuple[str, ...] = ()
    socket_env: Mapping[str, str] = field(default_factory=dict)
    address6: str | None = None  # its IPv6 address (simulated hosts made with ipv6=True)

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.exec_prefix, *argv]


class SimulatedNodes:
    """``with SimulatedNodes(2, hosts) as nodes:`` the nodes of one launched run. ``hosts="none"``: all on this
    host's loopback; ``"netns"``: each on a simulated host of its own, owned by this process (its reaper removes
    them if it is killed) and removed on exit, after the run's processes are gone."""

    def __init__(self, count: int, hosts: str = "none", ipv6: bool = False) -> None:
        if hosts not in ("none", "netns"):
            raise ValueError(f"hosts must be none or netns, not {hosts!r}")
        self.count, self.mode, self.ipv6 = count, hosts, ipv6
        self.hosts: SimulatedHosts | None = None
        self.nodes = [SimulatedNode(i) for i in range(count)]

    def __enter__(self) -> SimulatedNodes:
        if self.mode == "netns":
            self.hosts = SimulatedHosts(self.count, ipv6=self.ipv6).__enter__()
            self.nodes = [SimulatedNode(host.index, host.address, tuple(host.exec_prefix()), host.socket_env(),
                                        host.address6) for host in self.hosts.hosts]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.hosts is not None:
            self.hosts.close()
            self.hosts = None

    def __getitem__(self, index: int) -> SimulatedNode:
        return self.nodes[index]

    @property
    def master_addr(self) -> str:
        """Node 0's address: the launcher's rendezvous and the controller (global rank 0) live there."""
        return self.nodes[0].address

    @property
    def hosted(self) -> bool:
        return self.mode == "netns"

    def env(self, index: int) -> dict[str, str]:
        return dict(self.nodes[index].socket_env)

    def expect_addresses(self, node_of_rank: Sequence[int]) -> dict[str, str]:
        """For tests/harness_cases/launch_cases.py's test_placement: on simulated hosts every rank's TCP
        connections must run from its node's addresses to the nodes' addresses (nothing on loopback); a node's
        addresses as ``v4|v6`` where it has both."""
        if not self.hosted:
            return {}
        return {"EXPECT_ADDRESSES": ",".join("|".join(a for a in (self.nodes[node].address, self.nodes[node].address6)
                                                      if a) for node in node_of_rank)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def marked_processes(mark: str) -> list[str]:
    """'pid: command line' of every live process of one launched run (they all carry its mark)."""
    return [f"{pid}: {command_line(pid)}" for pid in processes_with_env(MARK_ENV, mark)]


def run_nodes(commands: list[tuple[list[str], dict]], tmp_path, timeout: float = 400.0,
              during=None, nodes: SimulatedNodes | None = None) -> list[tuple[int, str]]:
    """Start every command (one per simulated node or task), wait for all; prove none leaves a process.
    ``during(procs, mark, nodes)`` runs while they do (e.g. stop or cut off a node in the middle of the run)."""
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
            during([proc for proc, _ in procs], mark, nodes)
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


TWO_NODES_OF_TWO = (0, 0, 1, 1)  # the node of each global rank under two_torchrun_nodes


def two_torchrun_nodes(args: list[str], tmp_path, env=None, torchrun_args=(), during=None, hosts: str = "none",
                       rendezvous: str = "static", ipv6: bool = False) -> tuple[list[tuple[int, str]], dict]:
    """Two torchruns (--nnodes 2 --nproc-per-node 2), one per simulated node (on ``hosts``), the report's cases.

    ``rendezvous="static"``: --master-addr node 0's address (node 0's agent hosts the store). ``"c10d"``: the
    dynamic rendezvous at node 0's address, each agent naming its own node's address (--local-addr: what the
    workers get as MASTER_ADDR when the rank-0 agent is its, and what orders the nodes' ranks: node 0's
    first); on simulated hosts only node 0 hosts the rendezvous store (is_host): torch takes any address in
    127.0.0.0/8 for this machine's own, so node 1 would also start a store server in its namespace (unused:
    its client dials node 0's address, so the rendezvous works either way, measured). ``{node0}`` in ``args`` stands
    for node 0's address; ``{node0_v6}`` in ``args`` and ``env`` for its IPv6 address (simulated hosts made with
    ``ipv6=True``)."""
    port = free_port()
    report = tmp_path / "report"
    with SimulatedNodes(2, hosts, ipv6=ipv6) as nodes:
        def placed(text: str) -> str:
            return text.replace("{node0}", nodes.master_addr).replace("{node0_v6}", nodes[0].address6 or "")

        args = [placed(arg) for arg in args]
        env = {name: placed(value) for name, value in (env or {}).items()}
        commands = []
        for node in (0, 1):
            if rendezvous == "static":
                where = ["--node-rank", str(node), "--master-addr", nodes.master_addr, "--master-port", str(port)]
            elif rendezvous == "c10d":
                where = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{nodes.master_addr}:{port}",
                         "--rdzv-id", f"launch-{port}", "--local-addr", nodes[node].address]
                if nodes.hosted:
                    where += ["--rdzv-conf", f"is_host={int(node == 0)}"]
            else:
                raise ValueError(f"rendezvous must be static or c10d, not {rendezvous!r}")
            argv = [*TORCHRUN, *torchrun_args, "--nnodes", "2", "--nproc-per-node", "2", *where,
                    "-m", "fixtures.launch", *args, "-p", "no:cacheprovider", "--report-dir", str(report)]
            commands.append((nodes[node].command(argv), {"DISTCONFORM_HOSTNAME": f"node{node}", **nodes.env(node),
                                                         **nodes.expect_addresses(TWO_NODES_OF_TWO), **(env or {})}))
        results = run_nodes(commands, tmp_path, during=during, nodes=nodes)
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
    single = warm.run([sys.executable, "-m", "pytest", *args, "--world-size", "4", "-p", "no:cacheprovider",
                       "--report-dir", str(tmp_path / "single")],
                      cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert single.returncode == 0, single.stdout[-3000:]
    with open(tmp_path / "single" / "conformance.json") as fh:
        return {c["nodeid"]: c for c in json.load(fh)["cases"]}


def run_tasks(env_of, n: int, tmp_path, args=("tests/harness_cases/launch_cases.py", "-k", "placement"),
              nodes: SimulatedNodes | None = None, node_of=None):
    """n launched tasks, task r started with ``env_of(r)`` on node ``node_of(r)`` of ``nodes`` (this host when
    none are given); the report's outcomes."""
    report = tmp_path / "report"
    argv = [sys.executable, "-m", "fixtures.launch", *args, "-p", "no:cacheprovider", "--report-dir", str(report)]
    commands = []
    for rank in range(n):
        node = None if nodes is None else nodes[node_of(rank)]
        commands.append((argv if node is None else node.command(argv),
                         {**({} if node is None else node.socket_env), **env_of(rank)}))
    results = run_nodes(commands, tmp_path, timeout=300, nodes=nodes)
    with open(report / "conformance.json") as fh:
        return results, {c["nodeid"]: c["outcome"] for c in json.load(fh)["cases"]}
