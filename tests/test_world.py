"""fixtures/world.py and fixtures/pool.py driven directly: results, failures, hangs, crashes, clean-up."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from backends.registry import BackendRegistry
from backends.spec import BackendSpec
from fixtures.errors import DeadlineExceeded, RankDied, RankError, WorldStartError
from fixtures.pool import WorldPool
from fixtures.world import World
from tests.harness_cases import rank_fns
from tests.harness_cases.procs import REPO_ROOT, alive_of, pid_alive, rank_processes, session_of

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def registry():
    return BackendRegistry()


@pytest.fixture(scope="module")
def gloo(registry):
    return registry.get("gloo")


@pytest.fixture(scope="module")
def pool(registry):
    """Shared by the pool tests: the replacement world one test proves working is the next test's world."""
    pool = WorldPool(registry, deadline=30.0)
    # Every world of this pytest process shares the session tag: ranks that were alive before
    # this pool existed belong to other modules' worlds (checked by their own tests and by the
    # session-end check), not to this pool.
    earlier = set(rank_processes(pool.session_tag))
    yield pool
    pool.close_all()
    left = [pid for pid in rank_processes(pool.session_tag) if pid not in earlier and pid_alive(pid)]
    assert not alive_of(left), f"rank processes of {pool.session_tag} outlived close_all(): {left}"


def expected_sum(world_size):
    return [world_size * (world_size + 1) / 2.0] * world_size


def rank_pids(world):
    return [r["pid"] for r in world.run(rank_fns.whoami, "pids")]


def assert_gone(pids, what):
    left = alive_of(pids, timeout=3.0)
    assert not left, f"rank processes {left} outlived {what}"


# ------------------------------------------------------------- results
def test_run_returns_per_rank_results_in_rank_order_and_rank_error(gloo):
    world = World(gloo, 3, ("cpu",) * 3).start()
    try:
        results = world.run(rank_fns.whoami, "hello", extra=5)
        assert [r["rank"] for r in results] == [0, 1, 2]
        assert all(r["world_size"] == 3 and r["backend"] == "gloo" for r in results)
        assert all(r["tag"] == "hello" and r["extra"] == 5 for r in results)
        pids = [r["pid"] for r in results]
        assert len(set(pids)) == 3 and os.getpid() not in pids
        # the tag every no-leftover check relies on is carried by the rank processes
        assert all(session_of(pid) == world.session_tag for pid in pids)
        assert set(pids) <= set(rank_processes(world.session_tag))  # the leftover checks' view: ranks, as ranks
        assert world.run(rank_fns.all_reduce_rank_sum) == expected_sum(3)

        with pytest.raises(RankError) as info:
            world.run(rank_fns.raise_on_rank1)
        error = info.value
        assert set(error.failures) == {1}
        failure = error.failures[1]
        assert failure.rank == 1
        assert failure.exc_type == "tests.harness_cases.rank_fns.RankOneRefused"
        assert "marker-4711" in failure.message
        assert "Traceback (most recent call last)" in failure.traceback
        assert "raise_on_rank1" in failure.traceback and "marker-4711" in failure.traceback
        assert "ranks [1]" in str(error) and "RankOneRefused" in str(error) and "raise_on_rank1" in str(error)
        assert world.tainted
    finally:
        world.close()
    assert not world.alive
    # no grace period: close() returns only once the ranks are gone
    assert not [pid for pid in pids if pid_alive(pid)], "close() left rank processes running"


def test_no_rank_process_outlives_kill(gloo):
    world = World(gloo, 2, ("cpu", "cpu")).start()
    pids = rank_pids(world)
    assert all(pid_alive(pid) for pid in pids)
    world.kill()
    assert not [pid for pid in pids if pid_alive(pid)], "kill() left rank processes running"
    assert not world.alive
    world.kill()  # idempotent
    world.close()


# ----------------------------------------------------- hang: deadline
def test_hang_raises_deadline_exceeded_with_every_rank_stack(pool):
    world = pool.get("gloo", 2)
    pids = rank_pids(world)
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        world.run(rank_fns.hang_rank0_sleeps, deadline=3)
    elapsed = time.monotonic() - start
    assert 3.0 <= elapsed <= 7.0, f"deadline 3 s took {elapsed:.1f} s to fire"
    text = str(info.value)
    assert "hang_rank0_sleeps" in text and "3 s deadline" in text
    assert "--- rank 0 stack:" in text and "--- rank 1 stack:" in text
    rank0 = text.split("--- rank 0 stack:", 1)[1].split("--- rank 1 stack:", 1)[0]
    rank1 = text.split("--- rank 1 stack:", 1)[1]
    assert "in hang_rank0_sleeps" in rank0  # the sleeping frame
    assert "in barrier" in rank1 and "in hang_rank0_sleeps" in rank1  # the peer stuck in dist.barrier
    assert not world.alive
    assert_gone(pids, "a world killed at its deadline")

    # the pool replaces the dead world and the new one works
    again = pool.get("gloo", 2)
    assert again is not world and again.alive
    assert again.run(rank_fns.all_reduce_rank_sum) == expected_sum(2)


# ----------------------------------------------------- crash: rank death
def test_a_planned_rank_exit_returns_the_others_results_and_stops_the_world(pool):
    world = pool.get("gloo", 2)
    pids = rank_pids(world)
    assert world.run(rank_fns.rank1_exits_as_planned, exits={1}) == [0, None]
    assert not world.alive, "a world with a rank gone is stopped: the pool replaces it"
    assert_gone(pids, "a world after a planned rank exit")
    again = pool.get("gloo", 2)
    assert again is not world and again.run(rank_fns.all_reduce_rank_sum) == expected_sum(2)


@pytest.mark.parametrize("fn, status, text", [
    (rank_fns.crash_rank1_exit7, 7, "exit status 7"),
    (rank_fns.crash_rank1_sigkill, -9, "signal 9"),
    (rank_fns.crash_rank1_segfault, -11, "signal 11"),
], ids=["exit7", "sigkill", "segfault"])
def test_rank_death_raises_rank_died_naming_the_rank(pool, fn, status, text):
    world = pool.get("gloo", 2)
    pids = rank_pids(world)
    start = time.monotonic()
    with pytest.raises(RankDied) as info:
        world.run(fn)
    assert time.monotonic() - start < 10, "a dead rank must be noticed quickly, not at the deadline"
    assert info.value.rank == 1
    assert info.value.status == status
    message = str(info.value)
    assert "rank 1 of world gloo-ws2 died" in message and text in message and fn.__name__ in message
    assert "--- rank 0 stack:" in message
    if status == -11:  # a fatal signal: the dead rank's own Python stacks, from faulthandler
        assert "--- rank 1's Python stacks when it died (faulthandler):" in message
        assert "Fatal Python error: Segmentation fault" in message and "crash_rank1_segfault" in message, message
    assert not world.alive
    assert_gone(pids, "a world with a dead rank")

    again = pool.get("gloo", 2)
    assert again is not world
    assert again.run(rank_fns.all_reduce_rank_sum) == expected_sum(2)


# ------------------------------------------------------ pool recovery
def test_pool_reuses_a_healthy_world_and_recovers_a_tainted_one(pool):
    first = pool.get("gloo", 2)
    started = pool.started
    assert pool.get("gloo", 2) is first
    assert pool.started == started
    pids = rank_pids(first)
    with pytest.raises(RankError):
        first.run(rank_fns.raise_on_rank1)
    assert first.tainted
    # every rank returned: the pool gives the same processes fresh process groups
    again = pool.get("gloo", 2)
    assert again is first and not again.tainted and pool.started == started
    assert rank_pids(again) == pids
    assert again.run(rank_fns.all_reduce_rank_sum) == expected_sum(2)


def test_ranks_that_drew_different_group_names_get_fresh_groups_before_the_next_case(pool):
    """A case after which the ranks would name their next group differently taints the world (fixtures/world.py):
    the pool resets it, and the next case's new_group meets on every rank instead of hanging."""
    world = pool.get("gloo", 2)
    assert world.run(rank_fns.group_only_on_rank0) == [0, 1]
    assert world.tainted
    again = pool.get("gloo", 2)
    assert again is world and not again.tainted
    assert again.run(rank_fns.new_group_all_reduce_rank_sum, deadline=20.0) == expected_sum(2)
    assert not again.tainted


def test_pool_replaces_a_tainted_world_whose_reset_fails(pool):
    first = pool.get("gloo", 2)
    started = pool.started
    pids = rank_pids(first)
    with pytest.raises(RankError):
        first.run(rank_fns.raise_on_rank1)
    os.kill(pids[1], signal.SIGKILL)  # the reset will find rank 1 dead
    second = pool.get("gloo", 2)
    assert second is not first and pool.started == started + 1
    assert not first.alive
    assert_gone(pids, "a world whose reset failed")
    new_pids = rank_pids(second)
    assert set(new_pids).isdisjoint(pids)
    assert second.run(rank_fns.all_reduce_rank_sum) == expected_sum(2)


# ------------------------------------------------------------ start-up
@pytest.mark.parametrize("plugins, spec_name, expected", [
    (["tests.harness_cases.bad_plugin"], "gloo", ["RuntimeError: bad_plugin refuses to load: marker-9931"]),
    (["tests.harness_cases.no_such_module_xyz"], "gloo",
     ["ModuleNotFoundError: No module named 'tests.harness_cases.no_such_module_xyz'"]),
    ([], "nosuch_backend_xyz", ["unknown backend 'nosuch_backend_xyz'"]),
], ids=["plugin-raises", "plugin-missing", "unknown-backend"])
def test_failing_start_is_a_world_start_error(gloo, plugins, spec_name, expected):
    spec = gloo if spec_name == "gloo" else BackendSpec(name=spec_name)
    world = World(spec, 2, ("cpu", "cpu"), plugins=plugins, startup_deadline=60)
    before = set(rank_processes(world.session_tag))
    start = time.monotonic()
    with pytest.raises(WorldStartError) as info:
        world.start()
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert message.startswith(f"world {spec_name}-ws2 failed to start")
    for fragment in expected:
        assert fragment in message
    assert not world.alive
    new = set(rank_processes(world.session_tag)) - before
    assert not alive_of(new), f"a failed start left rank processes {new}"


# ------------------------------------------------------------ the zygote
@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "fresh"])
def test_a_zygote_forked_from_the_controller_serves_ranks_as_a_fresh_one_does(fork):
    """fixtures/zygote.py: a fork of a controller that has torch imported (forked) and a fresh interpreter (fresh)
    give the same ranks: titled with the session, found by the leftover checks, computing, gone after close()."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISTCONFORM_SESSION", "PYTEST_CURRENT_TEST")}
    env["DISTCONFORM_FORK_ZYGOTE"] = fork
    proc = subprocess.run([sys.executable, "-m", "tests.harness_cases.zygote_probe"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert (found["fresh_because"] == "") == (fork == "1"), found["fresh_because"]
    session = found["session"]
    assert found["zygote_parent"] == found["me"] and found["zygote_title"] == f"distconform-zygote --session {session}"
    assert found["rank_titles"] == [f"distconform-rank --session {session}"] * 2
    assert found["rank_stdin"] == ["/dev/null"] * 2  # not the zygote's request pipe, and not left closed
    assert found["rank_sessions"] == [session] * 2
    assert found["ranks_found"] == sorted(found["pids"])  # the ranks, not the zygote
    assert found["session_found"] == sorted(found["pids"] + [found["zygote"]])
    assert found["held_fd"] not in found["zygote_fds"] and found["zygote_fds"] == [0, 1, 2]
    assert found["sum"] == expected_sum(2)
    assert found["outlived_close"] == [] and found["zygote_outlived_stop"] == []
