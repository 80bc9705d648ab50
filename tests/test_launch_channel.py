"""fixtures/launch/: the control channel (authentication, IPv6, heartbeats both ways) and what a
supervisor hands its rank (fixtures/launch/boot.py), without launching anything."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from tests.harness_cases.launch_nodes import NO_IPV6, connection_closed
from tests.harness_cases.procs import REPO_ROOT


def test_control_channel_refuses_peers_without_the_secret():
    from fixtures.launch.cluster import RemoteCluster

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
        from fixtures.launch.protocol import Join

        for payload in (b"not a pickle", None, Join(7, "rank", "h", 1, 0, 1, "torchrun"),
                        Join(0, "intruder", "h", 1, 0, 1, "torchrun")):
            conn = Client(("127.0.0.1", cluster.port), authkey=key)
            conn.send_bytes(payload) if isinstance(payload, bytes) else send(conn, payload)
            assert conn.poll(10) and connection_closed(conn)
        with pytest.raises(Exception, match="did not connect"):
            cluster.wait_joined(1.0)
        assert any("authentication failed" in r for r in cluster.refused)
        assert all(l.data is None and l.watch is None for l in cluster.links.values())
    finally:
        cluster.finish(0, wait_s=0.1)


@pytest.mark.skipif(bool(NO_IPV6), reason=NO_IPV6 or "-")
def test_control_channel_over_ipv6():
    from fixtures.protocol import send
    from fixtures.launch.protocol import Join, dial
    from fixtures.launch.cluster import RemoteCluster

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


def _fake_supervisor(cluster, key, rank: int, host: str, answers: bool, debug_level: str = "OFF"):
    """A rank's two connections (the rank says it runs at ``debug_level``); its supervisor sends
    heartbeats only if ``answers``."""
    import threading

    from fixtures.protocol import recv, send
    from fixtures.launch.protocol import Heartbeat, Join, dial

    data, watch = dial(("127.0.0.1", cluster.port), key), dial(("127.0.0.1", cluster.port), key)
    send(data, Join(rank, "rank", host, 1, 0, 1, "torchrun", debug_level=debug_level))
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
    from fixtures.launch.cluster import RemoteCluster

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
        assert data.poll(5) and connection_closed(data)
    finally:
        cluster.finish(0, wait_s=2)


def test_a_supervisor_gives_up_a_silent_controller_and_kills_its_rank(capfd):
    import threading
    from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

    from fixtures.launch.supervisor import Supervisor
    from fixtures.launch.env import LaunchInfo
    from fixtures.protocol import recv, send
    from fixtures.launch.protocol import Heartbeat

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


def test_ranks_at_another_debug_level_than_the_launchs_stop_the_run_naming_them():
    """A node whose environment set another TORCH_DISTRIBUTED_DEBUG: its ranks say so when they join."""
    from fixtures.errors import WorldStartError
    from fixtures.launch.cluster import RemoteCluster

    key = secrets.token_bytes(32)
    cluster = RemoteCluster(2, key, "127.0.0.1", debug_level="DETAIL")
    try:
        _fake_supervisor(cluster, key, 0, "nodeA", answers=True, debug_level="DETAIL")
        _fake_supervisor(cluster, key, 1, "nodeB", answers=True, debug_level="OFF")
        with pytest.raises(WorldStartError) as info:
            cluster.wait_joined(10)
        assert str(info.value) == ("the launch runs at TORCH_DISTRIBUTED_DEBUG=DETAIL, but rank 1 on nodeB at OFF: "
                                   "give every launched process the same --debug-level (or the same "
                                   "$TORCH_DISTRIBUTED_DEBUG)")
    finally:
        cluster.finish(0, wait_s=0.1)


# ------------------------------------------------------------ what a supervisor hands its rank
def _boot(**over):
    from fixtures.launch.boot import RankBoot, StoreBootstrap

    fields = dict(rank=1, host="node1", local_rank=1, local_world_size=2, launcher="torchrun", stack_file="/tmp/s",
                  dump_dir="/tmp", controller=None, bootstrap=StoreBootstrap("node0", 29500, 4, 0, 300.0))
    return RankBoot(**{**fields, **over})


def test_a_rank_boot_travels_in_one_variable_and_back():
    from fixtures.launch.boot import RankBoot

    for boot in (_boot(), _boot(rank=0, controller=("::1", 4242), bootstrap=None)):
        env = boot.to_env()
        assert list(env) == ["DISTCONFORM_LAUNCH_BOOT"]
        assert RankBoot.from_env(env) == boot


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(extra=1), "unknown key(s) extra (a RankBoot has exactly rank, host, local_rank, "
                                  "local_world_size, launcher, stack_file, dump_dir, controller, bootstrap)"),
    (lambda d: d.pop("stack_file"), "missing key(s) stack_file (a RankBoot has exactly"),
    (lambda d: d["bootstrap"].pop("timeout"), "$DISTCONFORM_LAUNCH_BOOT.bootstrap: missing key(s) timeout"),
    (lambda d: d.update(rank="1"), "$DISTCONFORM_LAUNCH_BOOT.rank: expected int, got str '1'"),
    (lambda d: d.update(local_rank=True), "$DISTCONFORM_LAUNCH_BOOT.local_rank: expected int, got bool True"),
    (lambda d: d.update(controller=["h", "1"]), "$DISTCONFORM_LAUNCH_BOOT.controller[1]: expected int"),
    (lambda d: d.update(controller=["h", 1]), "names either the controller or the launcher's store to find it "
                                              "in, not both"),
])
def test_a_rank_boot_refuses_unknown_missing_or_mistyped_keys_naming_them(change, message):
    import json

    from fixtures.launch.boot import BOOT_ENV, BootError, RankBoot

    data = json.loads(_boot().to_env()[BOOT_ENV])
    change(data)
    with pytest.raises(BootError) as info:
        RankBoot.from_env({BOOT_ENV: json.dumps(data)})
    assert message in str(info.value)


def test_a_rank_started_without_its_boot_says_why():
    proc = subprocess.run([sys.executable, "-m", "fixtures.launch.rank"], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if not k.startswith("DISTCONFORM_LAUNCH")},
                          timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("distconform.launch: a launched rank cannot start: $DISTCONFORM_LAUNCH_BOOT is not "
                                   "set: a launched rank is started by its supervisor (python -m fixtures.launch), "
                                   "not on its own")
