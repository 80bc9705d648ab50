"""What the fault-tolerance clauses run on the ranks (torch 2.14): a reconfigurable default group, the exchange
of reconfigure handles over the case store, and what a rank reports of its group after each step
(suites/c10d/test_reconfigure.py, test_fault_signals.py; docs/fault-tolerance.md).

A clause's group is the world's default group made again with ``enable_reconfigure=True`` (the backend's init
options plus it, so every other init option holds) and replaced by a plain one afterwards: reconfigure
renumbers the default group, and later cases must find the world as they left it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from fixtures.rank import ctx, reinit_process_group

RECONFIGURE_TIMEOUT = timedelta(seconds=30)  # PyTorch's test_c10d_fault_tolerance.py gives the same
STORE_WAIT = timedelta(seconds=60)


def error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


@contextmanager
def reconfigurable_default_group(tag: str) -> Iterator[None]:
    """The world's default group made again with enable_reconfigure=True for the block, then a plain one."""
    spec = ctx.spec
    ctx.spec = dataclasses.replace(spec, init_options={**spec.init_options, "enable_reconfigure": True})
    try:
        reinit_process_group(f"ft-{ctx.case_id}-{tag}")
    finally:
        ctx.spec = spec
    try:
        yield
    finally:
        reinit_process_group(f"ft-{ctx.case_id}-{tag}-restored")


def backend():
    """The default group's c10d Backend on this world's device, as torch 2.14 hands it out."""
    return dist.get_backend_impl(dist.group.WORLD, torch.device(ctx.device))


def handles(key: str) -> list[str]:
    """Every rank's reconfigure handle, in rank order of the world (exchanged over the case store)."""
    ctx.store.set(f"{key}/{ctx.rank}", dist._get_reconfigure_handle())
    ctx.store.wait([f"{key}/{r}" for r in range(ctx.world_size)], STORE_WAIT)
    return [ctx.store.get(f"{key}/{r}").decode() for r in range(ctx.world_size)]


def store_barrier(key: str) -> None:
    ctx.store.set(f"{key}/{ctx.rank}", "1")
    ctx.store.wait([f"{key}/{r}" for r in range(ctx.world_size)], STORE_WAIT)


def reconfigure(uuid: int, peers: list[str]) -> None:
    dist._reconfigure(uuid, peers, timeout=RECONFIGURE_TIMEOUT).wait()


def own_handle() -> list[str]:
    return [dist._get_reconfigure_handle()]


def shape() -> tuple[int, int]:
    """(size, rank) of the default group as torch.distributed reports them."""
    return dist.get_world_size(), dist.get_rank()


def summed() -> float:
    """all_reduce SUM over the default group of (its rank + 1): size * (size + 1) / 2 when exact."""
    tensor = torch.full((4,), dist.get_rank() + 1.0, device=ctx.device)
    dist.all_reduce(tensor)
    values = tensor.cpu().tolist()
    return values[0] if len(set(values)) == 1 else float("nan")


def facts() -> tuple[int, int, float]:
    """(size, rank, all_reduce result) of the default group now."""
    return (*shape(), summed())


def triangle(size: int) -> float:
    """What summed() gives in a group of ``size`` ranks."""
    return float(size * (size + 1) // 2)
