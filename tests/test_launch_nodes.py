"""A launched world on two simulated nodes (tests/harness_cases/launch_nodes.py): the same outcomes as
one host, and what a hang, a rank death, a killed node and a stopped node (either side) look like.
The nodes run on this host's loopback, or under ``--hosts netns`` each on a simulated host of its own."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import time

import pytest

from fixtures.spawner import processes_with_env
from tests.harness_cases.fr_analyser import fr_trace_output
from tests.harness_cases.launch_nodes import (MARK_ENV, NO_IPV6, junit_failure, outcomes, single_host_cases,
                                              two_torchrun_nodes)

# A subset of suites/c10d and suites/p2p (run time on a shared 2-core machine): every
# all_reduce case, subgroups, and the p2p clauses that run on the default world.
SUBSET = ["suites/c10d/test_all_reduce.py", "suites/c10d/test_subgroups.py",
          "suites/p2p/test_send_recv.py", "suites/p2p/test_subsets.py", "suites/p2p/test_batch_isend_irecv.py"]
# DDP (torch's and the reference reducer, Join) and RPC (the reference-pg agent over the launched world's group)
TRAINING_SUBSET = ["suites/ddp/test_gradients.py", "suites/ddp/test_join.py",
                   "suites/rpc/test_calls.py", "suites/rpc/test_rrefs.py"]


@pytest.fixture(scope="module")
def two_nodes_and_one_host(tmp_path_factory, launch_hosts):
    """Both subsets in one launched run on two nodes and one single-host run at world size 4 (each costs
    two torchruns and their ranks, or a pytest and its world, to start: once for the two tests below);
    --rpc-agent only selects the agents of TRAINING_SUBSET's RPC cases."""
    tmp_path = tmp_path_factory.mktemp("two-nodes")
    args = [*SUBSET, *TRAINING_SUBSET, "--backend", "gloo", "--rpc-agent", "reference-pg", "-q"]
    results, launched = two_torchrun_nodes(args, tmp_path, hosts=launch_hosts)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    alone = single_host_cases(args, tmp_path)
    return tmp_path, launched, alone


def _of_files(cases: dict, files: list[str]) -> dict:
    return {nodeid: case for nodeid, case in cases.items() if nodeid.split("::")[0] in files}


def test_two_nodes_match_the_single_host_run_case_by_case(two_nodes_and_one_host):
    tmp_path, launched, alone = two_nodes_and_one_host
    launched, alone = _of_files(launched, SUBSET), _of_files(alone, SUBSET)
    assert len(alone) > 200
    assert outcomes(launched) == outcomes(alone)
    assert all("ws4" in nodeid for nodeid in launched)
    # every rank's log is collected into the report folder, named by rank and host
    assert sorted(os.listdir(tmp_path / "report" / "ranks")) == [
        "rank0-node0.log", "rank1-node0.log", "rank2-node1.log", "rank3-node1.log"]


def test_ddp_and_rpc_suites_run_unchanged_on_two_nodes(two_nodes_and_one_host):
    _, launched, alone = two_nodes_and_one_host
    assert {nodeid.split("::")[0] for nodeid in launched} == set(SUBSET) | set(TRAINING_SUBSET)
    launched, alone = _of_files(launched, TRAINING_SUBSET), _of_files(alone, TRAINING_SUBSET)
    assert outcomes(launched) == outcomes(alone)


def test_hang_on_node1_fails_with_every_rank_stack_both_hosts_and_the_flight_recorders(tmp_path, launch_hosts):
    """Rank 3 (node1) never enters the barrier: the failure shows every rank's stack headed by its host and, from
    the flight-recorder dumps the supervisors sent over the control channel, the collective each rank is in; the
    dumps are kept beside the report (JSON, and pickled with pg_config completed for fr_trace)."""
    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs",
                                          "--controller-address", "{node0}"], tmp_path, hosts=launch_hosts,
                                         env={"LAUNCH_CASE": "hang", "EXPECT_HOSTS": "node0,node0,node1,node1"})
    assert all(rc != 0 for rc, _ in results)  # the run fails on both nodes
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    assert by_name["test_placement[gloo-ws4]"]["outcome"] == "passed"
    assert by_name["test_injected_hang[gloo-ws4]"]["outcome"] == "failed"
    error = junit_failure(tmp_path, "test_injected_hang[gloo-ws4]")  # conformance.json keeps first lines only
    assert "did not finish within its 3 s deadline" in error
    for rank, host in ((0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")):
        assert f"--- rank {rank} stack:\n[host {host}]\n" in error
    assert error.count("in barrier") >= 3  # ranks 0-2 wait in the collective
    assert "time.sleep" in error or "last_rank_of_node1_sleeps_in_python" in error.split("--- rank 3 stack:")[1]
    hang = by_name["test_injected_hang[gloo-ws4]"]["error"].splitlines()[0]
    found = re.fullmatch(r"hang: rank 3 never entered barrier #(\d+) of group default_pg; ranks 0, 1, 2 wait in it",
                         hang)
    assert found, error
    seq = int(found.group(1))
    for rank in range(3):
        assert f"rank {rank}: waiting in barrier #{seq} of group default_pg" in error, error
    # rank 3's last collective: test_placement's (a barrier, and an all_reduce on simulated hosts), or none
    assert re.search(rf"rank 3: last entered \w+ #{seq - 1} ", error) or "rank 3: entered no collective of group " \
        "default_pg" in error, error
    kept = tmp_path / "report" / "flight-recorder" / "tests_harness_cases_launch_cases.py_test_injected_hang_gloo-ws4"
    assert f"flight-recorder dumps: {kept}" in error, error
    assert sorted(os.listdir(kept)) == [f"rank{r}.json" for r in range(4)] + [f"rank_{r}" for r in range(4)]
    for rank in range(4):
        assert json.loads((kept / f"rank{rank}.json").read_text())["distconform"]["rank"] == rank
        with open(kept / f"rank_{rank}", "rb") as fh:
            pickled = pickle.load(fh)
        if rank < 3:  # the ranks that recorded the default group: its pg_config row, completed for fr_trace
            assert pickled["pg_config"]["0"]["ranks"] == "[0, 1, 2, 3]", pickled["pg_config"]
    # torch's analyser reads the dumps that crossed the channel, and finds the same missing rank
    output = fr_trace_output(kept)
    assert "missing ranks: {3}" in output and f"sequence number: {seq}" in output, output
    after = by_name["test_after_failure[gloo-ws4]"]
    assert after["outcome"] == "skipped"
    assert after["reason"].startswith("launched world broken earlier in this run: DeadlineExceeded: "
                                      "last_rank_of_node1_sleeps_in_python did not finish")


def test_rank_death_on_node1_names_rank_host_and_status(tmp_path, launch_hosts):
    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path, hosts=launch_hosts,
                                         env={"LAUNCH_CASE": "death"})
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    death = by_name["test_injected_death[gloo-ws4]"]
    assert death["outcome"] == "failed"
    assert "rank 3 on host node1 died (exit status 7) while running last_rank_of_node1_exits_7" in death["error"]
    assert by_name["test_after_failure[gloo-ws4]"]["reason"] == (
        "launched world broken earlier in this run: rank 3 on host node1 died (exit status 7) while running "
        "last_rank_of_node1_exits_7 in world gloo-ws4")


def test_lost_node_fails_with_status_unknown_and_leaves_no_process(tmp_path, launch_hosts):
    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py"], tmp_path, hosts=launch_hosts,
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
    """A ``during`` for run_nodes: once both ranks of ``node`` asked, SIGSTOP every process of that
    node (its launcher, supervisors and ranks: no FIN, no exit status), wait for the other node's
    launcher (index ``wait_for``) to exit, then SIGCONT the stopped node."""

    def during(procs, mark, nodes):
        timings["controller_address"] = nodes.master_addr
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


def test_a_stopped_node_is_noticed_by_heartbeat_and_leaves_no_process(tmp_path, launch_hosts):
    """node1 is SIGSTOPped whole: the controller fails the case within the heartbeat limit naming
    rank and host, node0 exits; node1, resumed, finds the controller gone and exits too."""
    stop_request, timings = tmp_path / "stop-request", {}
    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "stop", "STOP_NODE": "node1",
                                              "STOP_REQUEST": str(stop_request),
                                              "DISTCONFORM_HEARTBEAT_TIMEOUT": str(HEARTBEAT_LIMIT_S)},
                                         during=_stop_a_node("node1", stop_request, 0, timings), hosts=launch_hosts)
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    stopped = by_name["test_injected_node_stop[gloo-ws4]"]
    assert stopped["outcome"] == "failed"
    assert re.search(r"rank [23] on host node1 is lost \(no heartbeat from its node for [0-9.]+ s \(limit 5 s\): "
                     r"the node stopped, crashed or was cut off", stopped["error"]), stopped["error"]
    assert stopped["duration"] < HEARTBEAT_LIMIT_S + 30  # the silence, not the case's 300 s deadline
    assert by_name["test_after_failure[gloo-ws4]"]["outcome"] == "skipped"


def test_a_stopped_controller_node_leaves_no_process_on_the_other(tmp_path, launch_hosts):
    """node0 (the controller's) is SIGSTOPped whole: node1's supervisors hear no heartbeat, kill their
    ranks and exit while node0 is still stopped; node0, resumed, fails the case and exits."""
    stop_request, timings = tmp_path / "stop-request", {}

    def node1_is_empty(mark):
        assert set(processes_with_env(MARK_ENV, mark)) & set(processes_with_env("DISTCONFORM_HOSTNAME", "node1")) == set()

    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path,
                                         env={"LAUNCH_CASE": "stop", "STOP_NODE": "node0",
                                              "STOP_REQUEST": str(stop_request),
                                              "DISTCONFORM_HEARTBEAT_TIMEOUT": str(HEARTBEAT_LIMIT_S)},
                                         during=_stop_a_node("node0", stop_request, 1, timings, node1_is_empty),
                                         hosts=launch_hosts)
    assert all(rc != 0 for rc, _ in results)
    assert timings["other_exited"] - timings["stopped"] < HEARTBEAT_LIMIT_S + 30
    assert re.search(rf"rank [23]: no heartbeat from the controller at {re.escape(timings['controller_address'])}:"
                     r"[0-9]+ for [0-9.]+ s \(limit 5 s\)", results[1][1]), results[1][1][-3000:]
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    assert by_name["test_injected_node_stop[gloo-ws4]"]["outcome"] == "failed"
    assert re.search(r"rank [23] on host node1 ", by_name["test_injected_node_stop[gloo-ws4]"]["error"])


# longer than the deadline and the flight-recorder wait (8 s): node0's dumps arrive before node1 is given up
PARTITION_HEARTBEAT_LIMIT_S = 20.0


def test_a_partitioned_node_times_the_collective_out(tmp_path, launch_hosts):
    """Simulated hosts only: node1's host is cut off on the bridge (silently, both ways) before its ranks enter
    an all_reduce the others wait in. The collective cannot finish, so traffic between the nodes really crosses
    the bridge: the case fails at its deadline, node0's ranks waiting in the all_reduce (their flight recorders),
    node1's ranks named by host with why nothing came back; every process of both nodes ends, never healed
    (node1's supervisors give the silent controller up)."""
    if launch_hosts != "netns":
        pytest.skip("a partition needs the nodes on simulated hosts (made wherever root and ip netns are: "
                    "here --hosts none was named, or they cannot be made)")
    request, done = tmp_path / "partition-request", tmp_path / "partition-done"

    def partition_node1(procs, mark, nodes):
        end = time.monotonic() + 240
        while not (request.exists() and len(request.read_text().split()) == 2):
            assert time.monotonic() < end and all(p.poll() is None for p in procs), "node1 never asked to be cut off"
            time.sleep(0.05)
        nodes.hosts.partition(1)
        done.touch()

    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-rs"], tmp_path, hosts=launch_hosts,
                                        env={"LAUNCH_CASE": "partition", "PARTITION_REQUEST": str(request),
                                             "PARTITION_DONE": str(done),
                                             "DISTCONFORM_HEARTBEAT_TIMEOUT": str(PARTITION_HEARTBEAT_LIMIT_S)},
                                        during=partition_node1)
    assert all(rc != 0 for rc, _ in results)
    by_name = {nodeid.split("::")[1]: c for nodeid, c in cases.items()}
    cut = by_name["test_injected_partition[gloo-ws4]"]
    assert cut["outcome"] == "failed"
    assert cut["duration"] < PARTITION_HEARTBEAT_LIMIT_S + 30  # the deadline and the waits for answers, bounded
    error = junit_failure(tmp_path, "test_injected_partition[gloo-ws4]")
    assert "node1_is_cut_off did not finish within its 3 s deadline" in error, error
    for rank in (0, 1):  # node0's ranks, reachable: their flight recorders show them inside the collective
        assert re.search(rf"rank {rank}: waiting in all_reduce #\d+ of group default_pg", error), error
        assert re.search(rf"--- rank {rank} stack:\n\[host node0\]\n(Current thread|Thread) 0x", error), error
    for rank in (2, 3):  # node1's, behind the partition: named by host, with why nothing came back
        assert re.search(rf"rank {rank}: no flight-recorder dump: on host node1, (no answer from its supervisor "
                         r"within \d+ s|its supervisor is gone)", error), error
        assert f"--- rank {rank} stack:\n[host node1]\n(" in error, error
    assert by_name["test_after_failure[gloo-ws4]"]["reason"].startswith(
        "launched world broken earlier in this run: DeadlineExceeded: node1_is_cut_off did not finish")


@pytest.fixture(scope="module")
def placement_at_detail(tmp_path_factory, launch_hosts):
    """One launched run of test_placement for the two tests below (a launch costs two torchruns and their
    ranks to start), with --debug-level DETAIL under a launcher whose environment says INFO. On this host's
    loopback: --controller-address ::1 where this host has IPv6 (else the default address). On simulated hosts
    (where ::1 is each host's own: the other node cannot dial it): torchrun's c10d rendezvous instead of the
    static one, at node 0's address."""
    tmp_path = tmp_path_factory.mktemp("placement")
    over_ipv6 = launch_hosts == "none" and not NO_IPV6
    address, expect_store = (["--controller-address", "::1"], {"EXPECT_STORE_HOST": "::1"}) if over_ipv6 else ([], {})
    results, cases = two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-k", "placement", *address,
                                         "--debug-level", "DETAIL"], tmp_path, hosts=launch_hosts,
                                        rendezvous="c10d" if launch_hosts == "netns" else "static",
                                        env={**expect_store, "EXPECT_HOSTS": "node0,node0,node1,node1",
                                             "TORCH_DISTRIBUTED_DEBUG": "INFO", "EXPECT_DEBUG_LEVEL": "DETAIL"})
    return results, cases


@pytest.fixture(scope="module")
def over_ipv6(request, tmp_path_factory, launch_hosts):
    """A launched run whose control channel and store go over IPv6: on loopback the run above (``::1``); on
    simulated hosts one of its own, the hosts made with IPv6 addresses and --controller-address node 0's
    (``fd00:0:0:77::1``), every rank's connections checked to run between the nodes' addresses."""
    if launch_hosts == "none":
        return request.getfixturevalue("placement_at_detail")
    return two_torchrun_nodes(["tests/harness_cases/launch_cases.py", "-k", "placement",
                               "--controller-address", "{node0_v6}"], tmp_path_factory.mktemp("ipv6"),
                              hosts=launch_hosts, rendezvous="c10d", ipv6=True,
                              env={"EXPECT_STORE_HOST": "{node0_v6}", "EXPECT_HOSTS": "node0,node0,node1,node1"})


@pytest.mark.skipif(bool(NO_IPV6), reason=NO_IPV6 or "-")
def test_ipv6_controller_address(over_ipv6, launch_hosts):
    """--controller-address over IPv6 (::1, or node 0's address on simulated hosts): the ranks dial the control
    channel and the world's store over IPv6."""
    results, cases = over_ipv6
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    assert [c["outcome"] for c in cases.values()] == ["passed"], cases


def test_the_debug_level_reaches_every_launched_rank(placement_at_detail):
    """--debug-level DETAIL under a launcher whose environment says INFO: the option wins, the case's id
    and report say DETAIL, and every rank runs at it (test_placement compares each rank's
    torch.distributed.get_debug_level() and $TORCH_DISTRIBUTED_DEBUG with the world's level)."""
    results, cases = placement_at_detail
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    [(nodeid, case)] = cases.items()
    assert (nodeid, case["outcome"], case["debug_level"]) == (
        "tests/harness_cases/launch_cases.py::test_placement[gloo-ws4-DETAIL]", "passed", "DETAIL")
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in results[0][1]  # the run's header
