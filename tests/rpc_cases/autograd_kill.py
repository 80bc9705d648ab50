"""Rank side of the killed-worker test (tests/test_reference_autograd.py): a worker dies inside its backward."""

from __future__ import annotations

import faulthandler
import os
import time

import torch
import torch.distributed as dist

from backends import rpc_agents

RPC_TIMEOUT_S = 5.0
# Where the dying worker writes the moment it dies (CLOCK_MONOTONIC, one clock for every process on the
# machine): the caller measures from there, so a loaded machine that is slow to deliver the backward to the
# worker does not count against the agent (it once did: 10.0 s beside two other test runs).
DEATH_SUFFIX = ".death"
_death_file = ""


class DieInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        with open(_death_file, "w") as out:
            out.write(repr(time.monotonic()))
        os._exit(3)  # the worker is killed mid-backward


def die_in_backward(x):
    return DieInBackward.apply(x) * 2


def run(rank: int, world_size: int, agent: str, path: str, results) -> None:
    # a stuck rank prints every thread's stack (the test's own get() gives up at 90 s)
    faulthandler.dump_traceback_later(45, exit=True)
    global _death_file
    _death_file = path + DEATH_SUFFIX
    store = dist.FileStore(path + ".store", world_size)
    if agent == "reference-pg":
        dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world_size)
    rpc = rpc_agents.start_agent(agent, rank=rank, world_size=world_size, store=dist.PrefixStore("agent", store),
                                 init_file=path + ".init", rpc_timeout=RPC_TIMEOUT_S)
    autograd = rpc_agents.autograd(agent)
    if rank != 0:
        time.sleep(60)  # serves until its backward kills it
        return
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    with autograd.context() as context_id:
        loss = rpc.rpc_sync("worker1", die_in_backward, args=(t,)).sum()
        start = time.monotonic()
        try:
            autograd.backward(context_id, [loss])
            outcome = ("returned", "")
        except Exception as exc:
            outcome = (type(exc).__name__, str(exc).splitlines()[0])
        failed_at = time.monotonic()
        try:
            with open(path + DEATH_SUFFIX) as death:
                died_at = float(death.read())
        except (OSError, ValueError):  # the worker never reached its death: measure the whole backward
            died_at = start
        took = failed_at - max(start, died_at)
        later = autograd.get_gradients(context_id)  # the context outlives the failed pass
    exited = True  # __exit__ returned: the failed clean-up to the dead worker is only logged
    results.put((outcome, took, len(later), exited))
    # Queue.put hands the item to a feeder thread; os._exit below would kill it before it wrote
    # (rank 0 then exited 0 and the test waited 90 s for nothing, about 1 run in 4)
    results.close()
    results.join_thread()
    try:
        rpc_agents.stop_agent(agent, graceful=False)
    finally:
        os._exit(0)
