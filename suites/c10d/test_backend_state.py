"""Contract: the hooks and state calls a backend offers beyond collectives work when called.

c10d offers completion hooks and waiting for pending Works for NCCL only, and
suspend/resume and memory statistics for backends that implement them; a
backend that does not declares the gap with its error (issue 25: XCCL binds
them and fails when they are called). Every clause works on a fresh
subgroup and destroys it:

* ``_register_on_completion_hook`` fires once per Work, with increasing
  sequence numbers and a duration;
* ``_wait_for_pending_works`` returns with every Work issued on the group
  completed;
* ``Backend.suspend()`` then ``resume()`` leave the group working;
* ``Backend.memory_stats()`` answers a dict.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.c10d.group_probes import backend_of, summed, total
from suites.checks import expect_tensor


# ------------------------------------------------------ rank side: hooks, state
def completion_hook() -> list:
    """(seq, duration in ms, op type) the hook saw for two all_reduces on a fresh group."""
    group = dist.new_group()
    seen = []
    try:
        group._register_on_completion_hook(
            lambda info: seen.append((info.seq, info.active_duration.total_seconds() * 1000, str(info.op_type))))
        for _ in range(2):
            dist.all_reduce(torch.ones(4, device=ctx.device), group=group, async_op=True).wait()
        deadline = time.monotonic() + 2.0
        while len(seen) < 2 and time.monotonic() < deadline:  # the hook runs on the backend's thread
            time.sleep(0.01)
        time.sleep(0.1)  # a second firing of one Work would come now
    finally:
        dist.barrier()
        dist.destroy_process_group(group)
    return seen


def pending_works() -> list[bool]:
    """is_completed() of three async all_reduces right after _wait_for_pending_works()."""
    group = dist.new_group()
    try:
        works = [dist.all_reduce(torch.ones(1 << 16, device=ctx.device), group=group, async_op=True)
                 for _ in range(3)]
        group._wait_for_pending_works()
        done = [work.is_completed() for work in works]
        for work in works:
            work.wait()
    finally:
        dist.barrier()
        dist.destroy_process_group(group)
    return done


def suspend_resume() -> torch.Tensor:
    """suspend() then resume() of the group's backend; an all_reduce on the group afterwards."""
    group = dist.new_group()
    try:
        backend = backend_of(group)
        dist.barrier(group=group)
        backend.suspend()
        backend.resume()
        return summed(group)
    finally:
        dist.barrier()
        dist.destroy_process_group(group)


def memory_stats() -> object:
    group = dist.new_group()
    try:
        return backend_of(group).memory_stats()
    finally:
        dist.destroy_process_group(group)


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(feature="completion_hook", collective="all_reduce")
def test_completion_hook_fires_once_per_work(world):
    """_register_on_completion_hook fires once per Work, with increasing sequence numbers and a duration."""
    for rank, seen in enumerate(world.run(completion_hook)):
        assert len(seen) == 2, f"rank {rank}: the hook fired {len(seen)} times for 2 all_reduces: {seen}"
        (seq_a, ms_a, _), (seq_b, ms_b, _) = seen
        assert seq_b > seq_a, f"rank {rank}: sequence numbers {seq_a}, {seq_b} do not increase"
        assert ms_a >= 0 and ms_b >= 0, f"rank {rank}: durations {ms_a} ms, {ms_b} ms"


@pytest.mark.needs(feature="pending_works", collective="all_reduce")
def test_wait_for_pending_works(world):
    """_wait_for_pending_works returns with every Work issued on the group completed."""
    for rank, done in enumerate(world.run(pending_works)):
        assert all(done), f"rank {rank}: after _wait_for_pending_works the Works' is_completed() are {done}"


@pytest.mark.needs(feature="suspend_resume", collective="all_reduce")
def test_suspend_resume_keeps_the_group(world):
    """Backend.suspend() then resume() leaves the group working."""
    for rank, value in enumerate(world.run(suspend_resume)):
        expect_tensor(value, total(range(world.world_size)), f"rank {rank}: all_reduce after suspend/resume")


@pytest.mark.needs(feature="memory_stats")
def test_memory_stats_answers(world):
    """Backend.memory_stats() answers a dict."""
    for rank, stats in enumerate(world.run(memory_stats)):
        assert isinstance(stats, dict), f"rank {rank}: memory_stats() gave {stats!r}"
