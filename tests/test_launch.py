"""fixtures/launch.py: the contract on a world started by torchrun / srun / mpirun.

No cluster here, so nodes are simulated: two torchrun invocations on this host
(--nnodes 2 --node-rank 0/1, rendezvous on 127.0.0.1 at a port found by
binding port 0), each node's host name set by DISTCONFORM_HOSTNAME. The srun
and Open MPI environments are simulated through their variables. Failures are
injected by tests/harness_cases/launch_cases.py (LAUNCH_CASE=...): a hang, a
rank death, a lost node (SIGKILL), a stopped node (SIGSTOP: only heartbeats
tell), and a death that torchrun's --max-restarts recovers from. Every run
proves that no process of it is left (they all carry MARK_ENV).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fixtures.launch_env import LaunchError, detect, first_slurm_host, host_and_port, split_world_size
from fixtures.spawner import processes_with_env
from tests.harness_cases.procs import REPO_ROOT, command_line

MARK_ENV = "DISTCONFORM_LAUNCH_TEST"  # every process of one launched run carries it: proof none is left
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# A subset of suites/c10d and suites/p2p (run time on a shared 2-core machine): every
# all_reduce case, subgroups, and the p2p clauses that run on the default world.
SUBSET = ["suites/c10d/test_all_reduce.py", "suites/c10d/test_subgroups.py",
          "suites/p2p/test_send_recv.py", "suites/p2p/test_subsets.py", "suites/p2p/test_batch_isend_irecv.py"]


# ------------------------------------------------------------ launcher variables
def _torchrun_env(**over):
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n0",
           "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True",
           "TORCHELASTIC_RESTART_COUNT": "0", "DISTCONFORM_HOSTNAME": "n1"}
    env.update(over)
    return env


def test_torchrun_variables():
    info = detect(_torchrun_env())
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("torchrun", 5, 8, 1, 4)
    assert (info.master_addr, info.master_port, info.agent_store, info.hostname) == ("n0", 29500, True, "n1")


def test_slurm_variables_first_host_and_port():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"}
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("srun", 3, 4, 1, 2)
    assert (info.master_addr, info.master_port) == ("gpu07", 20000 + 123456 % 10000)
    assert detect(dict(env, MASTER_PORT="4242", MASTER_ADDR="head")).master_port == 4242
    assert detect(dict(env, MASTER_PORT="4242", MASTER_ADDR="head")).master_addr == "head"


@pytest.mark.parametrize("nodelist, first", [("gpu[07-09,12],cpu1", "gpu07"), ("a1", "a1"), ("a1,b2", "a1"),
                                             ("node[3]", "node3"), ("10.0.0.5", "10.0.0.5")])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


@pytest.mark.parametrize("rank, size, local, local_size", [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")])
def test_mpi_variables(rank, size, local, local_size):
    env = {rank: "2", size: "4", local: "0", local_size: "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("mpirun", 2, 4, 0, 2)
    with pytest.raises(LaunchError, match="MASTER_ADDR is not"):
        detect({k: v for k, v in env.items() if k != "MASTER_ADDR"})


@pytest.mark.parametrize("env, message", [
    ({}, "no launcher variables found"),
    (_torchrun_env(RANK="8"), "rank 8 is outside world size 8"),
    (_torchrun_env(MASTER_PORT="http"), "MASTER_PORT='http' is not an integer"),
    (_torchrun_env(MASTER_PORT="70000"), "port 70000 is not a valid TCP port"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM variable SLURM_LOCALID is not set"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "[", "SLURM_JOB_ID": "1"},
     "cannot be parsed"),
])
def test_bad_launcher_variables_are_one_line_errors(env, message):
    with pytest.raises(LaunchError, match=message) as info:
        detect(env)
    assert "\n" not in str(info.value)


_VARS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
         "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
         "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_VARS), st.one_of(st.integers(-3, 70000).map(str), st.text(max_size=12))))
@example({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "\u00b2",
          "SLURM_JOB_NODELIST": "a", "SLURM_JOB_ID": "1"})
@example({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "MASTER_ADDR": "0"})  # no port to derive
@example({"OMPI_COMM_WORLD_RANK": "0", "MASTER_ADDR": "0", "MASTER_PORT": ":"})
def test_any_launcher_environment_is_a_launch_info_or_a_one_line_error(env):
    try:
        info = detect(env)
    except LaunchError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert 0 <= info.rank < info.world_size and 0 < info.master_port < 2 ** 16


def test_world_size_may_be_omitted_and_must_agree():
    info = detect(_torchrun_env())
    assert split_world_size(["suites/", "-q"], info) == ["suites/", "-q", "--world-size", "8"]
    assert split_world_size(["--world-size", "8", "-q"], info) == ["-q", "--world-size", "8"]
    assert split_world_size(["--world-size=8"], info) == ["--world-size", "8"]
    for bad in (["--world-size", "4"], ["--world-size=8,4"], ["--world-size", "2,3"]):
        with pytest.raises(LaunchError, match="disagrees with the launcher: torchrun started 8 ranks"):
            split_world_size(bad, info)


@pytest.mark.parametrize("args, env, expected", [
    (["--world-size", "3"], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": "1"},
     "distconform.launch: error: --world-size 3 disagrees with the launcher: torchrun started 2 ranks "
     "(omit --world-size under a launcher)"),
    (["suites/", "-n", "2"], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": "1"},
     "distconform.launch: error: -n: pytest-xdist cannot share one launched world (its ranks are the launcher's "
     "processes); drop -n/--dist"),
    (["--controller-address", "head:http"], {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     "distconform.launch: error: --controller-address 'head:http': expected HOST[:PORT], or an IPv6 address as "
     "::1 or [::1]:PORT"),
    ([], {}, "distconform.launch: error: no launcher variables found: run under torchrun, srun or mpirun "
             "(torchrun --nproc-per-node N -m fixtures.launch suites/ --backend gloo)"),
    ([], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
          "DISTCONFORM_HEARTBEAT_TIMEOUT": "soon"},
     "distconform.launch: error: $DISTCONFORM_HEARTBEAT_TIMEOUT='soon': expected a positive number of seconds"),
    ([], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
          "DISTCONFORM_SECRET_FILE": "/nonexistent/secret"},
     "distconform.launch: error: $DISTCONFORM_SECRET_FILE: cannot read /nonexistent/secret: No such file or directory"),
])
def test_usage_errors_are_one_line_on_every_rank(args, env, expected):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "OMPI_", "PMI", "TORCHELASTIC"))}
    proc = subprocess.run([sys.executable, "-m", "fixtures.launch", *args], cwd=REPO_ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4
    assert proc.stderr.strip().splitlines() == [expected]


# ------------------------------------------------------------ run order
class _Item:
    """What order_for_launched_world reads of a pytest item: its target, xfail marker and gap."""

    def __init__(self, name, target, gap=None):
        from types import SimpleNamespace

        from fixtures.pytest_plugin import mark_gap

        self.name, self.stash, self.markers = name, pytest.Stash(), {}
        self.callspec = SimpleNamespace(params={"world_target": SimpleNamespace(id=target)})
        mark_gap(self, gap, "gloo")

    def add_marker(self, mark):
        self.markers[mark.name] = mark

    def get_closest_marker(self, name):
        return self.markers.get(name)


def test_gaps_that_lose_the_world_run_last_in_their_world_by_their_declared_consequence():
    from backends.builtin import BUILTIN_SPECS
    from fixtures.launch import order_for_launched_world

    gloo = BUILTIN_SPECS["gloo"]
    aborts = gloo.gap_for(bad_input="all_reduce_mismatched_shapes", env={"TORCH_DISTRIBUTED_DEBUG": "OFF"})
    # its reason says "abort" (_abort_process_group) but it only fails: a text match would misorder it
    pending = gloo.gap_for(feature="abort", work="pending_on_abort")
    assert (aborts.consequence, pending.consequence) == ("kills_rank", "fails") and "abort" in pending.reason
    items = [_Item("kills", "ws4", aborts), _Item("a", "ws4"), _Item("pending", "ws4", pending),
             _Item("other-world", "ws2"), _Item("b", "ws4")]
    assert [i.name for i in order_for_launched_world(items, ["ws2", "ws4"])] == [
        "other-world", "a", "b", "pending", "kills"]


def test_a_gap_consequence_is_one_of_the_declared_ones():
    from backends.spec import CONSEQUENCES, Gap

    assert Gap({"feature": "abort"}, "r", consequence="hangs").loses_world
    assert not Gap({"feature": "abort"}, "r").loses_world
    with pytest.raises(ValueError, match="consequence 'crashes' is not one of " + ", ".join(CONSEQUENCES)):
        Gap({"feature": "abort"}, "r", consequence="crashes")


# ------------------------------------------------------------ control channel
def test_control_channel_refuses_peers_without_the_secret():
    from fixtures.remote_world import RemoteCluster

    key = secrets.token_bytes(32)
    cluster = RemoteCluster(2, key, "127.0.0.1")
    try:
        with pytest.raises(AuthenticationError):
            Client(("127.0.0.1", cluster.port), authkey=b"not the secret of this run")
        # garbage and silence: refused or timed out, never a crash of the accept loop
        for blob in (b"", b"\x00" * 64, secrets.token_bytes(300), b"#CHALLENGE#" * 40):
            with socket.create_connection(("127.0.0.1", cluster.port)) as sock:
                sock.sendall(blob)
        # authenticated but not a Join for a rank of this world: refused, the slot stays free
        from fixtures.protocol import send
        from fixtures.remote_protocol import Join

        for payload in (b"not a pickle", None, Join(7, "rank", "h", 1, 0, 1, "torchrun"),
                        Join(0, "intruder", "h", 1, 0, 1, "torchrun")):
            conn = Client(("127.0.0.1", cluster.port), authkey=key)
            conn.send_bytes(payload) if isinstance(payload, bytes) else send(conn, payload)
            assert conn.poll(10) and _closed(conn)
        with pytest.raises(Exception, match="did not connect"):
            cluster.wait_joined(1.0)
        assert any("authentication failed" in r for r in cluster.refused)
        assert all(l.data is None and l.watch is None for l in cluster.links.values())
    finally:
        cluster.finish(0, wait_s=0.1)


@pytest.mark.parametrize("text, expected", [
    ("head", ("head", 0)), ("head:29500", ("head", 29500)), ("::1", ("::1", 0)), ("[::1]:29500", ("::1", 29500)),
    ("[fe80::1%eth0]", ("fe80::1%eth0", 0)), (":4242", ("", 4242)), ("10.0.0.5:1", ("10.0.0.5", 1))])
def test_controller_address_forms(text, expected):
    assert host_and_port(text) == expected


@pytest.mark.parametrize("text", ["head:http", "[::1", "[::1]x", "[]:1", "head:70000", "head:-1"])
def test_bad_controller_address_is_a_one_line_error(text):
    with pytest.raises(LaunchError, match="expected HOST\\[:PORT\\], or an IPv6 address as ::1 or \\[::1\\]:PORT"):
        host_and_port(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=24))
def test_any_controller_address_is_parsed_or_a_one_line_error(text):
    try:
        host, port = host_and_port(text)
    except LaunchError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"--controller-address {text!r}: ")
        return
    assert 0 <= port < 2 ** 16 and isinstance(host, str)


def _ipv6_loopback() -> str:
    """'' if this host can listen and dial on ::1, else why not."""
    if not socket.has_ipv6:
        return "Python was built without IPv6"
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6) as server:
            socket.create_connection(("::1", server.getsockname()[1]), timeout=5).close()
    except OSError as exc:
        return f"no IPv6 loopback here (::1: {exc.strerror})"
    return ""


NO_IPV6 = _ipv6_loopback()


@pytest.mark.skipif(bool(NO_IPV6), reason=NO_IPV6 or "-")
def test_control_channel_over_ipv6():
    from fixtures.protocol import send
    from fixtures.remote_protocol import Join, dial
    from fixtures.remote_world import RemoteCluster

    key = secrets.token_bytes(32)
    cluster = RemoteCluster(1, key, "::1")
    try:
        conns = [dial(("::1", cluster.port), key), dial(cluster.local_address, key)]
        send(conns[0], Join(0, "rank", "h6", 1, 0, 1, "torchrun"))
        send(conns[1], Join(0, "watchdog", "h6", 2, 0, 1, "torchrun"))
        cluster.wait_joined(10)
        with pytest.raises(AuthenticationError):
            dial(("::1", cluster.port), b"not the secret of this run")
    finally:
        cluster.finish(0, wait_s=0.1)


def _fake_supervisor(cluster, key, rank: int, host: str, answers: bool):
    """A rank's two connections; its supervisor sends heartbeats only if ``answers``."""
    import threading

    from fixtures.protocol import recv, send
    from fixtures.remote_protocol import Heartbeat, Join, dial

    data, watch = dial(("127.0.0.1", cluster.port), key), dial(("127.0.0.1", cluster.port), key)
    send(data, Join(rank, "rank", host, 1, 0, 1, "torchrun"))
    send(watch, Join(rank, "watchdog", host, 2, 0, 1, "torchrun"))

    def beat():
        try:
            while True:
                if isinstance(recv(watch), Heartbeat):
                    send(watch, Heartbeat())
        except (EOFError, OSError):
            return

    if answers:
        threading.Thread(target=beat, daemon=True).start()
    return data, watch


def test_a_silent_node_is_given_up_within_the_heartbeat_limit():
    """rank 1's node goes silent with its connections open (no FIN): lost, named, cluster broken, EOF to it."""
    from fixtures.remote_world import RemoteCluster

    key = secrets.token_bytes(32)
    cluster = RemoteCluster(2, key, "127.0.0.1", heartbeat_timeout=2.0)
    try:
        _fake_supervisor(cluster, key, 0, "nodeA", answers=True)
        data, watch = _fake_supervisor(cluster, key, 1, "nodeB", answers=False)
        cluster.wait_joined(10)
        start = time.monotonic()
        while not cluster.links[1].lost and time.monotonic() - start < 10:
            time.sleep(0.05)
        assert time.monotonic() - start < 2.0 + 2.0  # the limit, plus a heartbeat period and scheduling
        assert cluster.links[1].exited and not cluster.links[0].lost
        assert cluster.broken_reason.startswith("rank 1 on host nodeB is lost: no heartbeat from its node for ")
        assert "the node stopped, crashed or was cut off" in cluster.broken_reason
        assert cluster.exit_status(1) == (None, False)  # at once: nobody is left to tell
        # the node, if it comes back, finds both connections closed
        assert data.poll(5) and _closed(data)
    finally:
        cluster.finish(0, wait_s=2)


def test_a_supervisor_gives_up_a_silent_controller_and_kills_its_rank(capfd):
    import threading
    from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

    from fixtures.launch import Supervisor
    from fixtures.launch_env import LaunchInfo
    from fixtures.protocol import recv, send
    from fixtures.remote_protocol import Heartbeat

    key = secrets.token_bytes(32)
    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def controller_that_falls_silent():
        sock, _ = server.accept()
        conn = Connection(sock.detach())
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
        recv(conn)  # the Join
        send(conn, Heartbeat(0.2, 1.0))
        held.append(conn)  # open, never another word

    threading.Thread(target=controller_that_falls_silent, daemon=True).start()
    info = LaunchInfo("torchrun", 1, 2, 0, 1, "127.0.0.1", 1, False, 0, "nodeB")
    supervisor = Supervisor(info, ("127.0.0.1", server.getsockname()[1]), key)
    supervisor.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    supervisor._pipe = open(os.devnull, "rb")
    try:
        start = time.monotonic()
        assert supervisor.serve() == 1
        assert time.monotonic() - start < 1.0 + 3.0
        assert supervisor.proc.poll() is not None  # the rank is killed, not orphaned
        assert "no heartbeat from the controller at 127.0.0.1:" in capfd.readouterr().err
    finally:
        supervisor.kill_rank()
        server.close()


def _closed(conn) -> bool:
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        return True
    return False


# ------------------------------------------------------------- simulated nodes
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _marked_processes(mark: str) -> list[str]:
    """'pid: command line' of every live process of one launched run (they all carry its mark)."""
    return [f"{pid}: {command_line(pid)}" for pid in processes_with_env(MARK_ENV, mark)]


def _run_nodes(commands: list[tuple[list[str], dict]], tmp_path, timeout: float = 400.0,
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
        while _marked_processes(mark) and time.monotonic() < end:
            time.sleep(0.2)
        assert _marked_processes(mark) == []
        return results
    finally:
        for proc, out in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.close()
        for line in _marked_processes(mark):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def _two_torchrun_nodes(args: list[str], tmp_path, env=None, torchrun_args=(), during=None,
                        ) -> tuple[list[tuple[int, str]], dict]:
    port = _free_port()
    report = tmp_path / "report"
    commands = []
    for node in (0, 1):
        argv = [*TORCHRUN, *torchrun_args, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(port),
                "-m", "fixtures.launch", *args, "-p", "no:cacheprovider", "--report-dir", str(report)]
        commands.append((argv, {"DISTCONFORM_HOSTNAME": f"node{node}", **(env or {})}))
    results = _run_nodes(commands, tmp_path, during=during)
    with open(report / "conformance.json") as fh:
        cases = {c["nodeid"]: c for c in json.load(fh)["cases"]}
    return results, cases


def _junit_failure(tmp_path, name: str) -> str:
    import xml.etree.ElementTree as ET

    for case in ET.parse(tmp_path / "report" / "junit.xml").iter("testcase"):
        if case.get("name") == name:
            text = "".join(f.text or "" for f in case.iter("failure"))
            # pytest's "E   " margin off, so the text reads as the exception's message
            return "\n".join(line[1:].strip() if line.startswith("E ") else line.strip() for line in text.splitlines())
    raise AssertionError(f"{name} not in junit.xml")


def _outcomes(cases: dict) -> dict:
    return {nodeid: c["outcome"] for nodeid, c in cases.items()}


def _single_host_cases(args: list[str], tmp_path) -> dict:
    """The same pytest arguments run on one host at world size 4 (it must pass): its cases by nodeid."""
    single = subprocess.run([sys.executable, "-m", "pytest", *args, "--world-size", "4", "-p", "no:cacheprovider",
                             "--report-dir", str(tmp_path / "single")],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert single.returncode == 0, single.stdout[-3000:]
    with open(tmp_path / "single" / "conformance.json") as fh:
        return {c["nodeid"]: c for c in json.load(fh)["cases"]}


def test_two_nodes_match_the_single_host_run_case_by_case(tmp_path):
    results, launched = _two_torchrun_nodes([*SUBSET, "--backend", "gloo", "-q"], tmp_path)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    alone = _single_host_cases([*SUBSET, "--backend", "gloo", "-q"], tmp_path)
    assert len(alone) > 200
    assert _outcomes(launched) == _outcomes(alone)
    assert all("ws4" in nodeid for nodeid in launched)
    # every rank's log is collected into the report folder, named by rank and host
    assert sorted(os.listdir(tmp_path / "report" / "ranks")) == [
        "rank0-node0.log", "rank1-node0.log", "rank2-node1.log", "rank3-node1.log"]


# DDP (torch's and the reference reducer, Join) and RPC (the reference-pg agent over the launched world's group)
TRAINING_SUBSET = ["suites/ddp/test_gradients.py", "suites/ddp/test_join.py",
                   "suites/rpc/test_calls.py", "suites/rpc/test_rrefs.py"]


def test_ddp_and_rpc_suites_run_unchanged_on_two_nodes(tmp_path):
    args = [*TRAINING_SUBSET, "--backend", "gloo", "--rpc-agent", "reference-pg", "-q"]
    results, launched = _two_torchrun_nodes(args, tmp_path)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    alone = _single_host_cases(args, tmp_path)
    assert {nodeid.split("::")[0] for nodeid in launched} == set(TRAINING_SUBSET)
    assert _outcomes(launched) == _outcomes(alone)


def test_hang_on_node1_fails_with_every_rank_stack_and_both_hosts(tmp_path):
    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs",
                                          "--controller-address", "127.0.0.1"], tmp_path,
                                         env={"LAUNCH_CASE": "hang", "EXPECT_HOSTS": "node0,node0,node1,node1"})
    assert all(rc != 0 for rc, _ in results)  # the run fails on both nodes
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    assert by_name["test_placement[gloo-ws4]"]["outcome"] == "passed"
    assert by_name["test_injected_hang[gloo-ws4]"]["outcome"] == "failed"
    error = _junit_failure(tmp_path, "test_injected_hang[gloo-ws4]")  # conformance.json keeps first lines only
    assert "did not finish within its 3 s deadline" in error
    for rank, host in ((0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")):
        assert f"--- rank {rank} stack:\n[host {host}]\n" in error
    assert error.count("in barrier") >= 3  # ranks 0-2 wait in the collective
    assert "time.sleep" in error or "last_rank_of_node1_sleeps_in_python" in error.split("--- rank 3 stack:")[1]
    after = by_name["test_after_failure[gloo-ws4]"]
    assert after["outcome"] == "skipped"
    assert after["reason"].startswith("launched world broken earlier in this run: DeadlineExceeded: "
                                      "last_rank_of_node1_sleeps_in_python did not finish")


def test_rank_death_on_node1_names_rank_host_and_status(tmp_path):
    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "death"})
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    death = by_name["test_injected_death[gloo-ws4]"]
    assert death["outcome"] == "failed"
    assert "rank 3 on host node1 died (exit status 7) while running last_rank_of_node1_exits_7" in death["error"]
    assert by_name["test_after_failure[gloo-ws4]"]["reason"] == (
        "launched world broken earlier in this run: rank 3 on host node1 died (exit status 7) while running "
        "last_rank_of_node1_exits_7 in world gloo-ws4")


def test_lost_node_fails_with_status_unknown_and_leaves_no_process(tmp_path):
    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py"], tmp_path,
                                         env={"LAUNCH_CASE": "nodeloss"})
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    lost = by_name["test_injected_node_loss[gloo-ws4]"]
    assert lost["outcome"] == "failed"
    assert re.search(r"rank [23] on host node1 died \(status unknown: its supervisor's connection closed too "
                     r"\(node lost\?\)\) while running node1_is_lost", lost["error"]), lost["error"]
    assert by_name["test_after_failure[gloo-ws4]"]["outcome"] == "skipped"


HEARTBEAT_LIMIT_S = 5.0


def _stop_a_node(node: str, stop_request, wait_for: int, timings: dict, check_while_stopped=None):
    """A ``during`` for _run_nodes: once both ranks of ``node`` asked, SIGSTOP every process of that
    node (its launcher, supervisors and ranks: no FIN, no exit status), wait for the other node's
    launcher (index ``wait_for``) to exit, then SIGCONT the stopped node."""

    def during(procs, mark):
        end = time.monotonic() + 240
        while not (stop_request.exists() and len(stop_request.read_text().split()) == 2):
            assert time.monotonic() < end and all(p.poll() is None for p in procs), f"{node} never asked to be stopped"
            time.sleep(0.1)
        stopped = sorted(set(processes_with_env(MARK_ENV, mark)) & set(processes_with_env("DISTCONFORM_HOSTNAME", node)))
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        timings["stopped"] = time.monotonic()
        try:
            procs[wait_for].wait(timeout=HEARTBEAT_LIMIT_S + 60)  # the other node gives this one up and ends
            timings["other_exited"] = time.monotonic()
            if check_while_stopped is not None:
                check_while_stopped(mark)
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    return during


def test_a_stopped_node_is_noticed_by_heartbeat_and_leaves_no_process(tmp_path):
    """node1 is SIGSTOPped whole: the controller fails the case within the heartbeat limit naming
    rank and host, node0 exits; node1, resumed, finds the controller gone and exits too."""
    stop_request, timings = tmp_path / "stop-request", {}
    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "stop", "STOP_NODE": "node1",
                                              "STOP_REQUEST": str(stop_request),
                                              "DISTCONFORM_HEARTBEAT_TIMEOUT": str(HEARTBEAT_LIMIT_S)},
                                         during=_stop_a_node("node1", stop_request, 0, timings))
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    stopped = by_name["test_injected_node_stop[gloo-ws4]"]
    assert stopped["outcome"] == "failed"
    assert re.search(r"rank [23] on host node1 is lost \(no heartbeat from its node for [0-9.]+ s \(limit 5 s\): "
                     r"the node stopped, crashed or was cut off", stopped["error"]), stopped["error"]
    assert stopped["duration"] < HEARTBEAT_LIMIT_S + 30  # the silence, not the case's 300 s deadline
    assert by_name["test_after_failure[gloo-ws4]"]["outcome"] == "skipped"


def test_a_stopped_controller_node_leaves_no_process_on_the_other(tmp_path):
    """node0 (the controller's) is SIGSTOPped whole: node1's supervisors hear no heartbeat, kill their
    ranks and exit while node0 is still stopped; node0, resumed, fails the case and exits."""
    stop_request, timings = tmp_path / "stop-request", {}

    def node1_is_empty(mark):
        assert set(processes_with_env(MARK_ENV, mark)) & set(processes_with_env("DISTCONFORM_HOSTNAME", "node1")) == set()

    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "stop", "STOP_NODE": "node0",
                                              "STOP_REQUEST": str(stop_request),
                                              "DISTCONFORM_HEARTBEAT_TIMEOUT": str(HEARTBEAT_LIMIT_S)},
                                         during=_stop_a_node("node0", stop_request, 1, timings, node1_is_empty))
    assert all(rc != 0 for rc, _ in results)
    assert timings["other_exited"] - timings["stopped"] < HEARTBEAT_LIMIT_S + 30
    assert re.search(r"rank [23]: no heartbeat from the controller at 127\.0\.0\.1:[0-9]+ for [0-9.]+ s \(limit 5 s\)",
                     results[1][1]), results[1][1][-3000:]
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    assert by_name["test_injected_node_stop[gloo-ws4]"]["outcome"] == "failed"
    assert re.search(r"rank [23] on host node1 ", by_name["test_injected_node_stop[gloo-ws4]"]["error"])


@pytest.mark.skipif(bool(NO_IPV6), reason=NO_IPV6 or "-")
def test_ipv6_controller_address(tmp_path):
    """--controller-address ::1: the ranks dial the control channel and the world's store over IPv6."""
    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-k", "placement",
                                          "--controller-address", "::1"], tmp_path,
                                         env={"EXPECT_STORE_HOST": "::1", "EXPECT_HOSTS": "node0,node0,node1,node1"})
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    assert _outcomes(cases) == {"tests/harness_cases/launch_cases.py::test_placement[gloo-ws4]": "passed"}


def test_max_restarts_continues_the_run_after_a_rank_death(tmp_path):
    """torchrun --max-restarts 1: rank 3 dies once; the restarted workers re-attach and the run continues."""
    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "restart"}, torchrun_args=["--max-restarts", "1"])
    outputs = "\n".join(out for _, out in results)
    assert all(rc != 0 for rc, _ in results), outputs[-3000:]  # a case failed: the run fails
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    with open(os.path.join(REPO_ROOT, "tests", "harness_cases", "launch_cases.py")) as fh:
        functions = re.findall(r"^def (test_\w+)\(", fh.read(), flags=re.M)
    assert sorted(by_name) == sorted(f"{name}[gloo-ws4]" for name in functions)  # every case of the file
    import xml.etree.ElementTree as ET

    names = [case.get("name") for case in ET.parse(tmp_path / "report" / "junit.xml").iter("testcase")]
    assert sorted(names) == sorted(by_name)  # once each in junit.xml too
    death = by_name["test_injected_death_once[gloo-ws4]"]
    assert death["outcome"] == "failed"
    assert "rank 3 on host node1 died (exit status 7)" in death["error"], death["error"]
    assert by_name["test_placement[gloo-ws4]"]["outcome"] == "passed"  # from the first attempt's journal
    assert by_name["test_after_failure[gloo-ws4]"]["outcome"] == "passed"  # run by the restarted workers
    assert "restart 1 of 1: 5 case(s) taken from the earlier attempts' journal" in results[0][1], results[0][1][-3000:]
    logs = sorted(os.listdir(tmp_path / "report" / "ranks"))
    assert "rank3-node1.log" in logs and "rank3-node1-restart1.log" in logs


JOURNAL_CASES = """
import os

def test_a():
    pass

def test_b():
    open("b-ran", "a").write("x")
    open("broken", "w").close()  # the fake cluster breaks here
    assert False, "the world broke"

def test_c():
    pass
"""


class _FakeCluster:
    broken_reason = "rank 3 on host node1 died (exit status 7)"

    @property
    def broken(self) -> bool:
        return os.path.exists("broken")


def test_max_restarts_continues_after_the_controller_itself_is_killed(tmp_path):
    """The controller is SIGKILLed mid-case (nothing journalled for it): the restarted controller
    records that case as failed because the world broke, and runs the rest; nothing is left."""
    results, cases = _two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "controller_killed"},
                                         torchrun_args=["--max-restarts", "1"])
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    killed = by_name["test_injected_controller_kill_once[gloo-ws4]"]
    assert killed["outcome"] == "failed"
    assert killed["error"].startswith("the launched world broke while this case ran: the controller was stopped "
                                      "before it learnt why; torchrun restarted the workers (now restart 1 of 1)")
    assert by_name["test_placement[gloo-ws4]"]["outcome"] == "passed"
    assert by_name["test_after_failure[gloo-ws4]"]["outcome"] == "passed"


def test_journal_replays_finished_cases_and_fails_the_one_the_world_broke_under(tmp_path, monkeypatch):
    """Attempt 0 breaks in test_b and stops; killed before test_b's outcome reached the journal,
    attempt 1 replays test_a, records test_b failed with the reason, runs test_c."""
    from fixtures.launch_journal import JOURNAL_NAME, RunJournal

    monkeypatch.chdir(tmp_path)
    (tmp_path / "test_cases.py").write_text(JOURNAL_CASES)
    args = ["test_cases.py", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]

    class Seen:
        def __init__(self):
            self.reports = []

        def pytest_runtest_logreport(self, report):
            self.reports.append(report)

    first = Seen()
    assert pytest.main(args, plugins=[RunJournal(_FakeCluster(), 0, 1, "run", args), first]) == 2  # interrupted
    assert [(r.nodeid.split("::")[1], r.when, r.outcome) for r in first.reports if r.when == "call"] == [
        ("test_a", "call", "passed"), ("test_b", "call", "failed")]
    # the controller was SIGKILLed before test_b's reports were journalled: cut the journal after its start
    journal = tmp_path / JOURNAL_NAME
    lines = journal.read_text().splitlines()
    cut = lines.index('{"kind": "start", "nodeid": "test_cases.py::test_b"}') + 1
    journal.write_text("\n".join(lines[:cut] + ['{"kind": "report", "nod']) + "\n")  # and a torn last line
    os.remove("broken")
    second = Seen()
    assert pytest.main(args, plugins=[RunJournal(_FakeCluster(), 1, 1, "run", args), second]) == 1
    calls = {r.nodeid.split("::")[1]: r for r in second.reports if r.when == "call"}
    assert {name: r.outcome for name, r in calls.items()} == {"test_a": "passed", "test_b": "failed", "test_c": "passed"}
    assert calls["test_b"].longreprtext.startswith("the launched world broke while this case ran: the controller "
                                                    "was stopped before it learnt why; torchrun restarted")
    assert (tmp_path / "b-ran").read_text() == "x"  # test_b did not run again
    # another run id: the journal is not this run's, everything runs
    third = Seen()
    pytest.main(args, plugins=[RunJournal(_FakeCluster(), 1, 2, "other run", args), third])
    assert (tmp_path / "b-ran").read_text() == "xx"
    # broken between cases (a node fell silent) while a restart remains: nothing runs or is recorded
    # (the launch plugin would skip the case with the reason): it is left to the restarted workers
    (tmp_path / "broken").touch()
    fourth = Seen()
    assert pytest.main(args, plugins=[RunJournal(_FakeCluster(), 0, 1, "run", args), fourth]) == 2
    assert fourth.reports == [] and '"kind": "start"' not in journal.read_text()


def _report_json(**over) -> dict:
    from _pytest.reports import TestReport, pytest_report_to_serializable

    report = TestReport("t.py::test_x", ("t.py", 1, "test_x"), {}, "passed", None, "call")
    return {**pytest_report_to_serializable(report), **over}


_REPORT_KEYS = sorted(_report_json())
_JUNK = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                  st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_ENTRY = st.one_of(
    st.fixed_dictionaries({"kind": st.sampled_from(["start", "finish", "report", "broken", "other"]),
                           "nodeid": st.one_of(st.just("t.py::test_x"), _JUNK),
                           "report": st.one_of(st.dictionaries(st.sampled_from(_REPORT_KEYS), _JUNK, max_size=3).map(
                               lambda over: _report_json(**over)), _JUNK),
                           "reason": _JUNK}),
    st.dictionaries(st.sampled_from(["kind", "nodeid", "report", "reason"]), _JUNK, max_size=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_ENTRY.map(json.dumps), st.text(max_size=30)), max_size=8), st.booleans())
def test_any_journal_is_taken_in_or_refused_with_a_note(lines, with_header):
    """The journal is read back from a file a killed process may have torn: never a crash."""
    import tempfile
    from types import SimpleNamespace

    from _pytest.reports import TestReport, pytest_report_from_serializable

    from fixtures.launch_journal import RunJournal

    journal = RunJournal(_FakeCluster(), 1, 1, "run", ["t.py"])
    journal._config = SimpleNamespace(hook=SimpleNamespace(
        pytest_report_from_serializable=lambda config, data: pytest_report_from_serializable(data)))
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as fh:
        fh.write("\n".join(([json.dumps(journal.header)] if with_header else []) + lines))
        fh.flush()
        if journal._read(fh.name):
            assert all(isinstance(r, TestReport) and r.nodeid == nodeid
                       for nodeid, reports in {**journal.finished, **journal.interrupted}.items() for r in reports)
        else:
            assert journal.note.endswith("the run starts over")


def _tasks(env_of, n: int, tmp_path, args=("tests/harness_cases/launch_cases.py", "-k", "placement")):
    report = tmp_path / "report"
    commands = [([sys.executable, "-m", "fixtures.launch", *args, "-p", "no:cacheprovider", "--report-dir", str(report)],
                 env_of(rank)) for rank in range(n)]
    results = _run_nodes(commands, tmp_path, timeout=300)
    with open(report / "conformance.json") as fh:
        return results, {c["nodeid"]: c["outcome"] for c in json.load(fh)["cases"]}


def test_srun_environment(tmp_path):
    """Three tasks on two simulated nodes as srun sets them up (block distribution, 2 + 1)."""
    port = str(_free_port())
    hosts = ["node0", "node0", "node1"]

    def env_of(rank):
        return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(rank % 2),
                "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_JOB_ID": "4711",
                "MASTER_PORT": port, "DISTCONFORM_HOSTNAME": hosts[rank], "EXPECT_HOSTS": ",".join(hosts)}

    results, outcomes = _tasks(env_of, 3, tmp_path)
    assert [rc for rc, _ in results] == [0, 0, 0], results[0][1][-3000:]
    assert outcomes == {"tests/harness_cases/launch_cases.py::test_placement[gloo-ws3]": "passed"}


def test_open_mpi_environment(tmp_path):
    port = str(_free_port())

    def env_of(rank):
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                "DISTCONFORM_HOSTNAME": f"node{rank}", "EXPECT_HOSTS": "node0,node1"}

    results, outcomes = _tasks(env_of, 2, tmp_path)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    assert outcomes == {"tests/harness_cases/launch_cases.py::test_placement[gloo-ws2]": "passed"}


def test_mpirun(tmp_path):
    if shutil.which("mpirun") is None:
        # .ci/run installs openmpi-bin: in CI a missing mpirun is a broken setup, not a reason to skip
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "mpirun is not installed (apt-get install openmpi-bin); the Open MPI variables are covered by "
            "test_open_mpi_environment")
    port = str(_free_port())
    argv = ["mpirun", "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PYTHONPATH",
            sys.executable, "-m", "fixtures.launch", "tests/harness_cases/launch_cases.py", "-k", "placement",
            "-p", "no:cacheprovider", "--report-dir", str(tmp_path / "report")]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    results = _run_nodes([(argv, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "PYTHONPATH": REPO_ROOT})], tmp_path)
    assert results[0][0] == 0, results[0][1][-3000:]
    with open(tmp_path / "report" / "conformance.json") as fh:
        assert {c["nodeid"]: c["outcome"] for c in json.load(fh)["cases"]} == {
            "tests/harness_cases/launch_cases.py::test_placement[gloo-ws2]": "passed"}


FAKE_SRUN = """#!/bin/bash
# stand-in for srun on one host: SLURM_NTASKS tasks, block-distributed over SLURM_NNODES simulated nodes
per_node=$(( (SLURM_NTASKS + SLURM_NNODES - 1) / SLURM_NNODES ))
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=$((i % per_node)) SLURM_NTASKS_PER_NODE=$per_node \\
        DISTCONFORM_HOSTNAME=node$((i / per_node)) "$@" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""


def _readme_sbatch_script() -> str:
    import re

    with open(os.path.join(REPO_ROOT, "docs", "clusters.md")) as fh:  # the README links there
        section = fh.read()
    scripts = [b for b in re.findall(r"```sh\n(.*?)```", section, flags=re.S) if b.startswith("#!/bin/bash")]
    assert len(scripts) == 1
    return scripts[0]


def test_readme_sbatch_script_runs_under_a_stand_in_srun(tmp_path):
    """The sbatch script of docs/clusters.md, verbatim, on 2 simulated nodes x 2 tasks (the suite selection overridden)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # "the venv is active"
    (bin_dir / "python").chmod(0o755)
    script = tmp_path / "distconform.sbatch"
    script.write_text(_readme_sbatch_script())
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
           "SLURM_JOB_ID": "4711", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "EXPECT_HOSTS": "node0,node0,node1,node1",
           "DISTCONFORM_ARGS": f"tests/harness_cases/launch_cases.py -k placement -p no:cacheprovider "
                               f"--report-dir {tmp_path / 'report'}"}
    [(rc, out)] = _run_nodes([(["bash", str(script)], env)], tmp_path)
    assert rc == 0, out[-3000:]
    with open(tmp_path / "report" / "conformance.json") as fh:
        assert {c["nodeid"]: c["outcome"] for c in json.load(fh)["cases"]} == {
            "tests/harness_cases/launch_cases.py::test_placement[gloo-ws4]": "passed"}
    assert not os.path.exists(tmp_path / ".distconform-4711.key")  # the script removes its secret
