"""Module-level functions that tests send to rank processes with ``World.run``.

They must live in a module the rank processes can import (they are pickled by
reference), hence here rather than inside the test files.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from fixtures.rank import ctx


class RankOneRefused(ValueError):
    """A distinctive exception type, so a test can check the type crosses the process boundary."""


def whoami(tag, *, extra=0):
    return {"rank": ctx.rank, "world_size": ctx.world_size, "backend": ctx.backend,
            "pid": os.getpid(), "tag": tag, "extra": extra}


def all_reduce_rank_sum() -> float:
    """Every rank contributes rank + 1; every rank returns ws * (ws + 1) / 2."""
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return t.item()


def raise_on_rank1():
    if ctx.rank == 1:
        raise RankOneRefused("rank 1 refuses: marker-4711")
    return ctx.rank


def group_only_on_rank0():
    """Rank 0 alone makes a one-rank group (which needs no peer): it draws a group name its peers do not, as the
    ranks that shrink a group do on torch 2.14 while the excluded ones stay out."""
    if ctx.rank == 0:
        dist.destroy_process_group(dist.new_group([0]))
    return ctx.rank


def new_group_all_reduce_rank_sum() -> float:
    """all_reduce_rank_sum in a new group of every rank: its name must be the same on every rank to meet."""
    group = dist.new_group()
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=group)
    dist.destroy_process_group(group)
    return t.item()


def hang_rank0_sleeps():
    """Rank 0 never reaches the barrier the other ranks wait in: a deadlock."""
    if ctx.rank == 0:
        time.sleep(120)
    else:
        dist.barrier()
    return ctx.rank


def crash_rank1_exit7():
    if ctx.rank == 1:
        os._exit(7)
    dist.barrier()
    return ctx.rank


def rank1_exits_as_planned():
    """Rank 1 ends its process on purpose (World.run(..., exits={1})); rank 0 answers once it is gone."""
    if ctx.rank == 1:
        os._exit(0)
    time.sleep(0.5)
    return ctx.rank


def crash_rank1_segfault():
    """Rank 1 reads address 0 from C (a segmentation fault, as a crash in torch's C++ would be)."""
    if ctx.rank == 1:
        import ctypes

        ctypes.string_at(0)
    dist.barrier()
    return ctx.rank


def crash_rank1_sigkill():
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return ctx.rank


def all_reduce_skipped_by(absent: int):
    """Three all_reduces on the default group every rank joins, then one that rank ``absent`` never enters
    (it sleeps): the others wait in it until the harness deadline."""
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if ctx.rank == absent:
        time.sleep(120)
    else:
        dist.all_reduce(t)
    return ctx.rank


def rank1_raises_rank0_all_reduces():
    """Rank 1 raises before an all_reduce rank 0 enters: rank 0 is still in it after the failure grace."""
    t = torch.ones(4)
    dist.all_reduce(t)
    if ctx.rank == 1:
        raise RankOneRefused("rank 1 refuses: marker-4712")
    dist.all_reduce(t)
    return ctx.rank
