"""Contract: process groups are created, destroyed and re-created in live processes without leftovers.

* ``destroy_process_group()`` then ``init_process_group()`` again in the same
  processes gives a working default group, any number of times;
* destroying one subgroup leaves the default group and other subgroups working;
* ``new_group(use_local_synchronization=True)`` is entered by its members only;
  ``new_subgroups`` and ``new_subgroups_by_enumeration`` give every rank its
  subgroup; ``split_group`` where the backend supports splitting;
* ``_abort_process_group`` (abort) and ``shutdown`` end a group; a Work pending
  on an aborted group fails instead of hanging;
* abort under load: with many all_reduces in flight on several groups,
  ``_abort_process_group()`` (every group, the default one too) returns within
  ABORT_RETURNS_S and every one of those Works fails within ABORT_WAIT_S of
  the abort; the ranks then make a new default group (the world lives on);
* a destroyed group leaves nothing behind: no thread, file descriptor,
  listening port or shared-memory mapping more than before it was created
  (measured in /proc after a warm-up cycle, so lazily created process-wide
  pools do not count).

Every clause leaves the world as it found it: a default group over all ranks.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx, reinit_process_group
from suites.checks import expect_tensor
from suites.soak import resources as held_by_process

LEAK_GRACE_S = 3.0
ABORT_WAIT_S = 3.0  # how long rank 0 waits on a Work whose group it aborted
ABORT_GROUP_TIMEOUT_S = 6.0  # threads and sockets of a destroyed group may take a moment to go
CYCLES = 3
# abort under load: this many subgroups, each with this many all_reduces in flight on every rank but the last
LOAD_GROUPS = 3
LOAD_OPS_PER_GROUP = 4
ABORT_RETURNS_S = 2.0  # how long _abort_process_group() itself may take


def total(ranks) -> torch.Tensor:
    return torch.full((4,), float(sum(r + 1 for r in ranks)))


def summed(group=None) -> torch.Tensor:
    """all_reduce of (rank + 1) over ``group``, on cpu."""
    tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(tensor, group=group)
    return tensor.cpu()


def evens_and_odds(n: int) -> list[list[int]]:
    return [list(range(0, n, 2)), list(range(1, n, 2))]


# ------------------------------------------------------- resources of a process
def resources() -> Counter:
    """What this process holds: OS threads, open descriptors by kind, listening TCP ports, /dev/shm mappings."""
    held: Counter = Counter()
    held["threads"] = len(os.listdir("/proc/self/task"))
    for thread in threading.enumerate():  # named Python threads, so a leftover says whose it is
        held[f"thread {thread.name.rstrip('0123456789-_')}"] += 1
    targets = held_by_process.descriptor_targets()
    for target in targets:
        kind = target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "file"
        held[f"fd {kind}"] += 1
    listening = held_by_process.listening_ports(held_by_process.socket_inodes(targets))
    if listening:
        held["listening ports"] = listening
    with open("/proc/self/maps") as fh:
        held["/dev/shm mappings"] = sum("/dev/shm/" in line for line in fh)
    return held


def settle(baseline: Counter | None = None) -> Counter:
    """Resources now, after giving a destroyed group's threads and sockets up to LEAK_GRACE_S to go
    (until nothing exceeds ``baseline``; without one, until two readings 0.2 s apart agree)."""
    if baseline is None:
        previous = None
        while True:
            gc.collect()
            now = resources()
            if now == previous:
                return now
            previous = now
            time.sleep(0.2)
    end = time.monotonic() + LEAK_GRACE_S
    while True:
        gc.collect()
        now = resources()
        if all(now[k] <= baseline[k] for k in now) or time.monotonic() > end:
            return now
        time.sleep(0.05)


def grown(before: Counter, after: Counter) -> dict:
    return {k: (before[k], after[k]) for k in after if after[k] > before[k]}


# ---------------------------------------------------------------- rank side
def reinit_default_group(cycles: int):
    """destroy_process_group + init_process_group, ``cycles`` times; the default group's all_reduce after each."""
    results = []
    for i in range(cycles):
        reinit_process_group(f"lifecycle-{ctx.case_id}-{i}")
        results.append((dist.is_initialized(), dist.get_world_size(), summed()))
    return results


def destroy_one_subgroup():
    n = ctx.world_size
    a, b = dist.new_group(list(range(n))), dist.new_group(list(range(n)))
    c = dist.new_group(list(range(1, n)) or [0])
    before = summed(a), summed(b)
    dist.destroy_process_group(a)
    after = {"default": summed(), "b": summed(b)}
    if ctx.rank in (list(range(1, n)) or [0]):
        after["c"] = summed(c)
    dist.destroy_process_group(b)
    if c != dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(c)
    return before, after


def local_synchronization():
    """Only the members (every rank but 0) call new_group; rank 0 goes straight to the default group's all_reduce."""
    members = list(range(1, ctx.world_size))
    result = None
    if ctx.rank in members:
        group = dist.new_group(members, use_local_synchronization=True)
        result = (dist.get_rank(group), dist.get_world_size(group), summed(group))
        dist.destroy_process_group(group)
    return result, summed()


def new_subgroups():
    n = ctx.world_size
    size = 2 if n % 2 == 0 else n
    mine, subgroups = dist.new_subgroups(group_size=size)
    result = dist.get_process_group_ranks(mine), summed(mine)
    for group in subgroups:
        dist.destroy_process_group(group)
    return result


def new_subgroups_by_enumeration():
    mine, subgroups = dist.new_subgroups_by_enumeration(evens_and_odds(ctx.world_size))
    result = dist.get_process_group_ranks(mine), dist.get_rank(mine), summed(mine)
    for group in subgroups:
        dist.destroy_process_group(group)
    return result


def split_group():
    group = dist.split_group(split_ranks=evens_and_odds(ctx.world_size))
    result = dist.get_process_group_ranks(group), summed(group)
    dist.destroy_process_group(group)
    return result


def shrink_group():
    """A subgroup of every rank shrunk by its last rank (which, as torch requires, stays out of the shrink)."""
    last = ctx.world_size - 1
    group = dist.new_group()
    result, shrank = None, False
    if ctx.rank != last:
        try:
            shrunk = dist.shrink_group([last], group=group)
        except Exception as exc:  # reported by the clause; every rank still meets at the barrier below
            result = f"{type(exc).__name__}: {exc}"
        else:
            shrank = True
            result = dist.get_process_group_ranks(shrunk), summed(shrunk)
            dist.destroy_process_group(shrunk)
    dist.barrier()
    if not shrank:  # shrink_group destroys the group it shrinks on the ranks that shrank it (torch 2.13)
        dist.destroy_process_group(group)
    return result


def shutdown_then_destroy():
    """group.shutdown() by hand, then destroy_process_group(group) (which shuts it down again)."""
    group = dist.new_group()
    first = summed(group)
    dist.barrier()  # nobody shuts down while a peer is still in the all_reduce
    group.shutdown()
    dist.destroy_process_group(group)
    return first, summed()


def abort_idle_subgroup():
    group = dist.new_group()
    first = summed(group)
    dist.distributed_c10d._abort_process_group(group)
    return first, summed()


def abort_fails_pending_work():
    """Rank 0's all_reduce waits for ranks that never come; aborting the group must end it with an error.

    wait() is bounded (ABORT_WAIT_S) and the group's own timeout is short, so a backend whose abort leaves
    the Work pending fails the clause in seconds and its stuck operation ends soon after.
    """
    group = dist.new_group(timeout=timedelta(seconds=ABORT_GROUP_TIMEOUT_S))
    outcome = None
    if ctx.rank == 0:
        work = dist.all_reduce(torch.ones(4, device=ctx.device), group=group, async_op=True)
        time.sleep(0.2)
        start = time.perf_counter()  # the abort itself counts: one that blocks until the timeout ends nothing
        dist.distributed_c10d._abort_process_group(group)
        try:
            work.wait(timeout=timedelta(seconds=ABORT_WAIT_S))
            outcome = (False, time.perf_counter() - start, "")
        except Exception as exc:
            outcome = (True, time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
        ctx.store.set("aborted", "1")
    else:
        ctx.store.wait(["aborted"], timedelta(seconds=60))
        dist.distributed_c10d._abort_process_group(group)
    return outcome, summed()


def abort_under_load():
    """Every rank but the last issues LOAD_OPS_PER_GROUP async all_reduces on each of LOAD_GROUPS fresh groups;
    the last never joins them, so all stay in flight. Those ranks then abort every group at once
    (``_abort_process_group()``, the default group too) and wait on each Work within what is left of
    ABORT_WAIT_S after the abort began; only then does the last rank abort (so no Work ends because a peer
    closed its side). Every rank then makes a new default group.

    Returns (seconds the abort took, [(raised, seconds since the abort began, error) per Work] (empty on the
    last rank), the new default group's all_reduce).
    """
    last = ctx.world_size - 1
    groups = [dist.new_group(timeout=timedelta(seconds=ABORT_GROUP_TIMEOUT_S)) for _ in range(LOAD_GROUPS)]
    works = []
    if ctx.rank != last:
        works = [dist.all_reduce(torch.ones(4, device=ctx.device), group=group, async_op=True)
                 for group in groups for _ in range(LOAD_OPS_PER_GROUP)]
        ctx.store.set(f"issued/{ctx.rank}", "1")
        ctx.store.wait([f"issued/{r}" for r in range(last)], timedelta(seconds=60))
        time.sleep(0.2)  # the operations reach the backend's threads
    else:
        ctx.store.wait([f"ended/{r}" for r in range(last)], timedelta(seconds=60))
    start = time.perf_counter()
    dist.distributed_c10d._abort_process_group()
    abort_s = time.perf_counter() - start
    outcomes = []
    for work in works:
        left = max(ABORT_WAIT_S - (time.perf_counter() - start), 0.01)
        try:
            work.wait(timeout=timedelta(seconds=left))
            outcomes.append((False, time.perf_counter() - start, ""))
        except Exception as exc:  # the finding: the backend's own error text
            outcomes.append((True, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"))
    if ctx.rank != last:
        ctx.store.set(f"ended/{ctx.rank}", "1")
    reinit_process_group(f"abort-load-{ctx.case_id}")
    return abort_s, outcomes, summed()


def _subgroup_cycle() -> None:
    group = dist.new_group()
    summed(group)
    dist.barrier(group=group)
    dist.destroy_process_group(group)
    del group


def subgroup_leftovers():
    """Resources after CYCLES subgroup create/use/destroy cycles minus before (after one warm-up cycle)."""
    _subgroup_cycle()
    before = settle()
    dist.barrier()
    for _ in range(CYCLES):
        _subgroup_cycle()
    return grown(before, settle(before)), summed()


def reinit_leftovers():
    """Resources after CYCLES default-group re-inits minus before (after one warm-up re-init)."""
    reinit_process_group(f"leak-{ctx.case_id}-warmup")
    summed()
    before = settle()
    dist.barrier()  # nobody destroys the group while another rank is still measuring it
    for i in range(CYCLES):
        reinit_process_group(f"leak-{ctx.case_id}-{i}")
        summed()
    return grown(before, settle(before)), summed()


# ------------------------------------------------------------------ clauses
pytestmark = pytest.mark.needs(collective="all_reduce", feature="lifecycle")


def test_reinit_default_group_in_same_processes(world):
    """destroy_process_group then init_process_group in the same processes gives a working group, again and again."""
    n = world.world_size
    for rank, cycles in enumerate(world.run(reinit_default_group, CYCLES)):
        for i, (initialised, size, value) in enumerate(cycles):
            assert initialised and size == n, f"rank {rank}, cycle {i}: is_initialized={initialised}, size={size}"
            expect_tensor(value, total(range(n)), f"rank {rank}: all_reduce after re-init {i}")


@pytest.mark.needs(feature="subgroups")
def test_destroying_one_subgroup_leaves_the_others_working(world):
    """Destroying one subgroup leaves the default group and other subgroups (same or other members) working."""
    n = world.world_size
    for rank, (before, after) in enumerate(world.run(destroy_one_subgroup)):
        for value in before:
            expect_tensor(value, total(range(n)), f"rank {rank}: subgroup all_reduce before the destroy")
        expect_tensor(after["default"], total(range(n)), f"rank {rank}: default group after destroying a subgroup")
        expect_tensor(after["b"], total(range(n)), f"rank {rank}: a sibling subgroup after destroying a subgroup")
        if "c" in after:
            expect_tensor(after["c"], total(range(1, n) or [0]), f"rank {rank}: a smaller subgroup after the destroy")


@pytest.mark.needs(feature="subgroups", clause="test_new_group_local_synchronization")
@pytest.mark.min_world_size(2)
def test_new_group_local_synchronization(world):
    """new_group(use_local_synchronization=True) is entered by its members only and works among them."""
    n = world.world_size
    members = list(range(1, n))
    for rank, (inside, default) in enumerate(world.run(local_synchronization)):
        expect_tensor(default, total(range(n)), f"rank {rank}: the default group afterwards")
        if rank in members:
            group_rank, size, value = inside
            assert (group_rank, size) == (members.index(rank), len(members)), f"rank {rank}: {group_rank}/{size}"
            expect_tensor(value, total(members), f"rank {rank}: all_reduce on the locally synchronised group")


@pytest.mark.needs(feature="subgroups")
def test_new_subgroups(world):
    """new_subgroups(group_size) gives every rank the subgroup of its consecutive block, which reduces over it."""
    n = world.world_size
    size = 2 if n % 2 == 0 else n
    for rank, (ranks, value) in enumerate(world.run(new_subgroups)):
        block = list(range(rank // size * size, rank // size * size + size))
        assert ranks == block, f"rank {rank}: in subgroup {ranks}, expected {block}"
        expect_tensor(value, total(block), f"rank {rank}: all_reduce in its subgroup")


@pytest.mark.needs(feature="subgroups")
@pytest.mark.min_world_size(2)
def test_new_subgroups_by_enumeration(world):
    """new_subgroups_by_enumeration gives every rank its listed subgroup (evens, odds) and its rank in it."""
    groups = evens_and_odds(world.world_size)
    for rank, (ranks, group_rank, value) in enumerate(world.run(new_subgroups_by_enumeration)):
        want = groups[rank % 2]
        assert ranks == want and group_rank == want.index(rank), f"rank {rank}: {ranks}, group rank {group_rank}"
        expect_tensor(value, total(want), f"rank {rank}: all_reduce in its enumerated subgroup")


@pytest.mark.needs(feature="splitting")
@pytest.mark.min_world_size(2)
def test_split_group(world):
    """split_group(split_ranks) gives every rank its split (evens, odds), which reduces over its members."""
    groups = evens_and_odds(world.world_size)
    for rank, (ranks, value) in enumerate(world.run(split_group)):
        assert ranks == groups[rank % 2], f"rank {rank}: in split {ranks}"
        expect_tensor(value, total(groups[rank % 2]), f"rank {rank}: all_reduce in its split")


@pytest.mark.needs(feature="shrinking")
@pytest.mark.min_world_size(2)
def test_shrink_group(world):
    """shrink_group([rank], group) gives the remaining ranks a group of themselves, which reduces over them."""
    kept = list(range(world.world_size - 1))
    for rank, result in enumerate(world.run(shrink_group)[:-1]):
        assert not isinstance(result, str), f"rank {rank}: shrink_group raised {result}"
        ranks, value = result
        assert ranks == kept, f"rank {rank}: the shrunk group holds {ranks}, expected {kept}"
        expect_tensor(value, total(kept), f"rank {rank}: all_reduce in the shrunk group")


@pytest.mark.needs(feature="abort")
def test_shutdown_then_destroy(world):
    """ProcessGroup.shutdown() followed by destroy_process_group (a second shutdown) is harmless."""
    n = world.world_size
    for rank, (first, after) in enumerate(world.run(shutdown_then_destroy)):
        expect_tensor(first, total(range(n)), f"rank {rank}: the subgroup before its shutdown")
        expect_tensor(after, total(range(n)), f"rank {rank}: the default group after shutdown + destroy")


@pytest.mark.needs(feature="abort")
def test_abort_idle_subgroup(world):
    """Aborting an idle subgroup ends it; the default group keeps working."""
    n = world.world_size
    for rank, (first, after) in enumerate(world.run(abort_idle_subgroup)):
        expect_tensor(first, total(range(n)), f"rank {rank}: the subgroup before the abort")
        expect_tensor(after, total(range(n)), f"rank {rank}: the default group after the abort")


@pytest.mark.needs(feature="abort", work="pending_on_abort")
@pytest.mark.min_world_size(2)
def test_abort_fails_pending_work(world, record_property):
    """A Work pending on a group that is aborted fails at once (well within 3 s) instead of waiting out the group timeout."""
    results = world.run(abort_fails_pending_work)
    (raised, seconds, error), _ = results[0]
    assert raised, f"rank 0: the pending all_reduce returned after the abort ({seconds:.2f} s) instead of failing"
    assert seconds < ABORT_WAIT_S * 0.8, \
        f"rank 0: the abort did not end the pending all_reduce at once: abort + wait({ABORT_WAIT_S:g} s) took " \
        f"{seconds:.2f} s: {error}"
    record_property("finding", f"pending work after abort: {error.splitlines()[0]}")
    for rank, (_, after) in enumerate(results):
        expect_tensor(after, total(range(world.world_size)), f"rank {rank}: the default group after the abort")


@pytest.mark.needs(feature="abort", work="pending_on_abort")
@pytest.mark.min_world_size(2)
def test_abort_under_load_ends_every_pending_work(world, record_property):
    """Aborting every group with 12 all_reduces in flight on 3 groups returns within 2 s and fails all of them within 3 s."""
    results = world.run(abort_under_load)
    abort_s, outcomes, _ = results[0]
    record_property("finding", f"abort under load: rank 0's abort took {abort_s:.2f} s, its last Work ended "
                               f"{max(s for _, s, _ in outcomes):.2f} s after it began: "
                               f"{outcomes[-1][2].splitlines()[0][:160] or 'returned'}")
    for rank, (abort_s, outcomes, _) in enumerate(results):
        assert abort_s < ABORT_RETURNS_S, \
            f"rank {rank}: _abort_process_group() took {abort_s:.2f} s (bound {ABORT_RETURNS_S:g} s)"
        returned = [i for i, (raised, _, _) in enumerate(outcomes) if not raised]
        assert not returned, f"rank {rank}: Works {returned} of {len(outcomes)} returned after the abort instead of failing"
        late = [(i, seconds, error.splitlines()[0][:160]) for i, (_, seconds, error) in enumerate(outcomes)
                if seconds >= ABORT_WAIT_S * 0.8]
        assert not late, (f"rank {rank}: the abort did not end {len(late)} of {len(outcomes)} pending Works at once "
                          f"(ended {ABORT_WAIT_S * 0.8:g} s or more after it began; the first: Work {late[0][0]} "
                          f"after {late[0][1]:.2f} s: {late[0][2]})")
    for rank, (_, _, after) in enumerate(results):
        expect_tensor(after, total(range(world.world_size)), f"rank {rank}: the new default group after the abort")


@pytest.mark.needs(feature="subgroups")
def test_destroyed_subgroups_leave_nothing_behind(world):
    """Creating, using and destroying subgroups leaves no thread, fd, listening port or shm mapping behind."""
    for rank, (leftovers, after) in enumerate(world.run(subgroup_leftovers)):
        assert not leftovers, (f"rank {rank}: after {CYCLES} subgroups were created and destroyed it holds more "
                               f"than before (before, after): {leftovers}")
        expect_tensor(after, total(range(world.world_size)), f"rank {rank}: the default group afterwards")


def test_reinit_leaves_nothing_behind(world):
    """Re-initialising the default group again and again leaves no thread, fd, listening port or shm mapping behind."""
    for rank, (leftovers, after) in enumerate(world.run(reinit_leftovers)):
        assert not leftovers, (f"rank {rank}: after {CYCLES} re-inits of the default group it holds more than "
                               f"before (before, after): {leftovers}")
        expect_tensor(after, total(range(world.world_size)), f"rank {rank}: the default group afterwards")
