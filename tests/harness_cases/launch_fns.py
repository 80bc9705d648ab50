"""Rank-side functions of tests/harness_cases/launch_cases.py (importable by launched ranks)."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from fixtures.launch.env import hostname
from fixtures.rank import ctx


def where() -> dict:
    assert ctx.config is not None
    return {"rank": ctx.rank, "host": hostname(), "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
            "device": ctx.device, "world_size": ctx.world_size, "store_host": ctx.config.store[0],
            # the level torch runs at in this rank, and the variable it was read from
            "debug_level": dist.get_debug_level().name, "debug_env": os.environ.get("TORCH_DISTRIBUTED_DEBUG")}


def all_reduce_rank_sum() -> float:
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return t.item()


def last_rank_of_node1_sleeps_in_python() -> None:
    """The last rank (on the simulated node1) never enters the collective; the others wait in it."""
    if ctx.rank == ctx.world_size - 1:
        while True:
            time.sleep(0.05)  # marker: last_rank_of_node1_sleeps_in_python
    dist.barrier()


def last_rank_of_node1_exits_7() -> None:
    if ctx.rank == ctx.world_size - 1:
        os._exit(7)
    dist.barrier()


def last_rank_of_node1_exits_7_on_the_first_attempt() -> None:
    """As last_rank_of_node1_exits_7 while torchrun has not restarted the workers; a no-op barrier after."""
    if ctx.rank == ctx.world_size - 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os._exit(7)
    dist.barrier()


def the_controller_is_killed_on_the_first_attempt() -> None:
    """Rank 0's parent is the controller (pytest): SIGKILLed mid-case, before any outcome is journalled."""
    if ctx.rank == 0 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
    dist.barrier()


def a_node_stops() -> None:
    """The ranks of node $STOP_NODE ask the test to SIGSTOP their whole node (file $STOP_REQUEST), then
    wait to be stopped; the others wait in a barrier. Nothing closes a connection: only the silence tells."""
    if hostname() == os.environ["STOP_NODE"]:
        with open(os.environ["STOP_REQUEST"], "a") as fh:
            fh.write(f"{ctx.rank}\n")
        time.sleep(600)
    dist.barrier()


def node1_is_lost() -> None:
    """Every launched process of node1 is SIGKILLed (its ranks die with them): a lost node."""
    if hostname() == "node1":
        os.kill(os.getppid(), signal.SIGKILL)  # the supervisor, i.e. the launcher's worker
        time.sleep(60)
    dist.barrier()
