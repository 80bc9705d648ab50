"""Groups over every rank made with an explicit name, so threads may create them at once.

``dist.new_group`` names a group by a process-wide counter: two threads creating groups at once could
take the counter in different orders on different ranks and pair unrelated groups. Naming each group
(``soak/<case>/<thread>/<cycle>``) makes every rank agree whatever the threads' interleaving, as MPICH's
threaded communicator tests give each thread its own parent communicator.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from fixtures.rank import ctx


def named_group(name: str, timeout_s: float, store: dist.Store | None = None) -> dist.ProcessGroup:
    """A new group over every rank of the world, named ``name`` on every rank.

    No lock is held around the construction: a gloo or reference group connects to its peers while it is
    built, so a per-process lock would let two ranks each wait, holding it, for a group the other builds
    (torch's tables are dicts whose single writes the GIL keeps whole). ``store``: the rendezvous store
    (default: the case's); a thread that must not wait behind another thread's blocking store read passes
    its own client (``ctx.store.clone()``)."""
    ranks = list(range(ctx.world_size))
    pg, _ = c10d._new_process_group_helper(
        ctx.world_size, ctx.rank, ranks, dist.get_backend(), ctx.store if store is None else store,
        group_name=name, timeout=timedelta(seconds=timeout_s))
    c10d._world.pg_group_ranks[pg] = {r: r for r in ranks}  # what new_group adds after the helper
    return pg


def destroy(pg: dist.ProcessGroup) -> None:
    dist.destroy_process_group(pg)


def checked_all_reduce(pg: dist.ProcessGroup, salt: int, numel: int = 8) -> None:
    """all_reduce of (rank + 1) * salt over ``pg``; raises naming the group when the sum is wrong."""
    tensor = torch.full((numel,), float((ctx.rank + 1) * salt), device=ctx.device)
    pg.allreduce([tensor]).wait()
    expected = float(salt * ctx.world_size * (ctx.world_size + 1) // 2)
    if not bool((tensor == expected).all()):
        raise AssertionError(f"all_reduce on group {pg.group_name}: got {tensor.tolist()}, expected {expected}")
