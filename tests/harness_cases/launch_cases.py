"""Injected failures on a launched world (run by tests/test_launch_*.py under two torchruns).

Each failing test is followed by a normal one: a launched world cannot be
replaced, so the follower must skip with the one reason the world broke.
"""

import os

import pytest

from tests.harness_cases import launch_fns


def test_placement(world):
    places = world.run(launch_fns.where)
    assert [p["rank"] for p in places] == list(range(world.world_size))
    # EXPECT_HOSTS / EXPECT_DEVICES: what the launching test set up, one entry per rank
    if os.environ.get("EXPECT_HOSTS"):
        assert [p["host"] for p in places] == os.environ["EXPECT_HOSTS"].split(",")
    assert [p["device"] for p in places] == ["cpu"] * world.world_size
    if os.environ.get("EXPECT_STORE_HOST"):  # the address every rank dialled for the world's store
        assert {p["store_host"] for p in places} == {os.environ["EXPECT_STORE_HOST"]}
    # every rank runs at the level the case's id and the report say
    assert [(p["debug_level"], p["debug_env"]) for p in places] == [(world.debug_level,) * 2] * world.world_size
    if os.environ.get("EXPECT_DEBUG_LEVEL"):
        assert world.debug_level == os.environ["EXPECT_DEBUG_LEVEL"]
    if os.environ.get("EXPECT_ADDRESSES"):  # nodes on simulated hosts: every byte crosses the bridge
        # per rank, its node's addresses ("v4" or "v4|v6"); an address is known by the node it belongs to
        expected = os.environ["EXPECT_ADDRESSES"].split(",")
        node_of = {address: node for node in expected for address in node.split("|")}
        for rank, every in enumerate(world.run(launch_fns.tcp_connections)):
            # rank 0 (and its supervisor) reach the controller, a process of their own host, on its loopback
            connections = [c for c in every if c not in (("127.0.0.1", "127.0.0.1"), ("::1", "::1"))]
            assert connections, f"rank {rank} has no TCP connection beyond its host's loopback: {every}"
            assert all(local in node_of and remote in node_of for local, remote in connections), (rank, connections)
            # from its node's addresses only (a rank on loopback would show 127.0.0.1), to the node of every peer
            # (gloo connects every pair) and to node 0's (the controller and the world's store)
            peers = {expected[peer] for peer in range(world.world_size) if peer != rank} | {expected[0]}
            assert {node_of[local] for local, _ in connections} == {expected[rank]}, (rank, connections)
            assert {node_of[remote] for _, remote in connections} == peers, (rank, connections)


@pytest.mark.skipif(os.environ.get("LAUNCH_CASE") != "hang", reason="selected by LAUNCH_CASE=hang")
@pytest.mark.deadline(3)
def test_injected_hang(world):
    world.run(launch_fns.last_rank_of_node1_sleeps_in_python)


@pytest.mark.skipif(os.environ.get("LAUNCH_CASE") != "death", reason="selected by LAUNCH_CASE=death")
def test_injected_death(world):
    world.run(launch_fns.last_rank_of_node1_exits_7)


@pytest.mark.skipif(os.environ.get("LAUNCH_CASE") != "nodeloss", reason="selected by LAUNCH_CASE=nodeloss")
def test_injected_node_loss(world):
    world.run(launch_fns.node1_is_lost)


@pytest.mark.skipif(os.environ.get("LAUNCH_CASE") != "restart", reason="selected by LAUNCH_CASE=restart")
def test_injected_death_once(world):
    world.run(launch_fns.last_rank_of_node1_exits_7_on_the_first_attempt)


@pytest.mark.skipif(os.environ.get("LAUNCH_CASE") != "controller_killed",
                    reason="selected by LAUNCH_CASE=controller_killed")
def test_injected_controller_kill_once(world):
    world.run(launch_fns.the_controller_is_killed_on_the_first_attempt)


@pytest.mark.skipif(os.environ.get("LAUNCH_CASE") != "stop", reason="selected by LAUNCH_CASE=stop")
@pytest.mark.deadline(300)  # far beyond the heartbeat limit: the silence must be noticed first
def test_injected_node_stop(world):
    world.run(launch_fns.a_node_stops)


@pytest.mark.skipif(os.environ.get("LAUNCH_CASE") != "partition", reason="selected by LAUNCH_CASE=partition")
@pytest.mark.deadline(3)
def test_injected_partition(world):
    world.run(launch_fns.node1_is_cut_off)


def test_after_failure(world):
    assert world.run(launch_fns.all_reduce_rank_sum) == [world.world_size * (world.world_size + 1) / 2.0] * world.world_size
