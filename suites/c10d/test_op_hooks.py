"""Contract: a group's pre and post hooks see every operation it issues, once each, in order (torch 2.14).

``ProcessGroup.register_pre_hook(id, fn)`` runs ``fn(PreHookArgs)`` before each operation is issued,
``register_post_hook(id, fn)`` runs ``fn(PostHookArgs)`` after; ``unregister_*_hook(id)`` ends that. Measured
on gloo under torch 2.14.1 (suites/c10d/fault_tolerance_measure.py hooks): for all_reduce, broadcast(src),
all_reduce(async_op=True), barrier and a send/recv pair each rank sees a pre then a post hook per operation,
named by ``HookOpName`` (ALLREDUCE, BROADCAST, ALLREDUCE, BARRIER, SEND/RECV), with one op id for the pair,
op ids increasing, ``async_op`` as the caller asked (a p2p operation is async), ``root`` the broadcast's
source (the peer for send/recv) and the post hook given the Work; once unregistered, nothing runs.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx

pytestmark = pytest.mark.needs(collective="all_reduce", feature="op_hooks")

HOOK_ID = 7


# ---------------------------------------------------------------- rank side
def hooked_operations() -> dict:
    """The hooks' calls for a fixed sequence of operations; then how many calls after unregistering them."""
    group, seen = dist.group.WORLD, []
    group.register_pre_hook(HOOK_ID, lambda a: seen.append(("pre", a.name.name, a.op_id, a.async_op, a.root)))
    group.register_post_hook(HOOK_ID, lambda a: seen.append(("post", a.name.name, a.op_id, a.async_op,
                                                             a.work is not None)))
    try:
        dist.all_reduce(torch.ones(2, device=ctx.device))
        dist.broadcast(torch.zeros(2, device=ctx.device), src=ctx.world_size - 1)
        dist.all_reduce(torch.ones(2, device=ctx.device), async_op=True).wait()
        dist.barrier()
        if ctx.rank == 0:
            dist.send(torch.ones(1, device=ctx.device), 1)
        elif ctx.rank == 1:
            dist.recv(torch.zeros(1, device=ctx.device), 0)
    finally:
        group.unregister_pre_hook(HOOK_ID)
        group.unregister_post_hook(HOOK_ID)
    hooked = list(seen)
    dist.all_reduce(torch.ones(2, device=ctx.device))
    return {"hooked": hooked, "after unregister": len(seen) - len(hooked)}


def expected_operations(rank: int, n: int) -> list[tuple]:
    """(name, async_op, root) per operation of hooked_operations on ``rank``."""
    ops = [("ALLREDUCE", False, -1), ("BROADCAST", False, n - 1), ("ALLREDUCE", True, -1), ("BARRIER", False, -1)]
    if rank == 0:
        ops.append(("SEND", True, 1))
    elif rank == 1:
        ops.append(("RECV", True, 0))
    return ops


# ------------------------------------------------------------------ clauses
@pytest.mark.min_world_size(2)
def test_pre_and_post_hooks_see_every_operation(world):
    """Each operation runs the pre hook then the post hook (same op id, its HookOpName, async_op, root, the Work)."""
    n = world.world_size
    for rank, found in enumerate(world.run(hooked_operations)):
        hooked = found["hooked"]
        pres, posts = hooked[0::2], hooked[1::2]
        assert [h[0] for h in hooked] == ["pre", "post"] * (len(hooked) // 2) and len(hooked) % 2 == 0, \
            f"rank {rank}: hooks out of order: {hooked}"
        assert [(p[1], p[3], p[4]) for p in pres] == expected_operations(rank, n), \
            f"rank {rank}: (name, async_op, root) of the pre hooks: {pres}"
        assert [(q[1], q[2], q[3], q[4]) for q in posts] == [(p[1], p[2], p[3], True) for p in pres], \
            f"rank {rank}: the post hooks (name, op id, async_op, has a Work) against the pre hooks: {posts}"
        ids = [p[2] for p in pres]
        assert ids == sorted(set(ids)), f"rank {rank}: op ids not increasing: {ids}"
        assert found["after unregister"] == 0, f"rank {rank}: {found['after unregister']} hook calls after unregister"
