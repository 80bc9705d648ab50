"""Contract: collectives on a subgroup involve its members only.

A group made by new_group(ranks) reduces, broadcasts and gathers among its
members; ranks outside it get GroupMember.NON_GROUP_MEMBER and their tensors
stay untouched. The subgroups here leave out rank 0 where possible, so a
backend that confuses group ranks with global ranks shows.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import values
from suites.checks import expect_tensor

UNTOUCHED = -7.0


def members(world_size):
    """Every rank but rank 0, in global order (new_group sorts ranks: group rank i is the
    i-th smallest member). At world size 2 that is a one-member group, which still
    checks that rank 0 stays out of it."""
    return list(range(1, world_size))


def subgroup():
    """The cached subgroup of this world; new_group must be entered by every rank."""
    ranks = members(ctx.world_size)
    key = ("subgroup", tuple(ranks))
    if key not in ctx.scratch:
        ctx.scratch[key] = dist.new_group(ranks=ranks)
    return ctx.scratch[key], ranks


# ---------------------------------------------------------------- rank side
def subgroup_all_reduce():
    group, ranks = subgroup()
    tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    if ctx.rank in ranks:
        dist.all_reduce(tensor, group=group)
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
        tensor.fill_(UNTOUCHED)
    return tensor.cpu()


def subgroup_non_member_call_is_a_no_op():
    """A non-member that calls the collective anyway must not take part or block."""
    group, ranks = subgroup()
    tensor = torch.full((4,), UNTOUCHED, device=ctx.device)
    if ctx.rank not in ranks:
        dist.all_reduce(tensor, group=group)  # c10d returns at once for non-members
    else:
        tensor.fill_(float(ctx.rank + 1))
        dist.all_reduce(tensor, group=group)
    return tensor.cpu()


def subgroup_broadcast_from_each_member():
    group, ranks = subgroup()
    received = {}
    for root in ranks:
        tensor = values.rank_payload(ctx.rank, 5).to(ctx.device)
        if ctx.rank in ranks:
            dist.broadcast(tensor, src=root, group=group)  # src is a global rank
        received[root] = tensor.cpu()
    return received


def subgroup_all_gather():
    group, ranks = subgroup()
    mine = values.rank_payload(ctx.rank, 3).to(ctx.device)
    if ctx.rank not in ranks:
        return None
    out = [torch.zeros_like(mine) for _ in ranks]
    dist.all_gather(out, mine, group=group)
    return [t.cpu() for t in out]


def subgroup_rank_queries():
    group, ranks = subgroup()
    if ctx.rank not in ranks:
        return None
    return dist.get_rank(group), dist.get_world_size(group), dist.get_process_group_ranks(group)


# ------------------------------------------------------------------ clauses
@pytest.mark.min_world_size(2)  # a proper subgroup needs a rank outside it
@pytest.mark.needs(collective="all_reduce", feature="subgroups")
def test_subgroup_all_reduce_members_only(world):
    """all_reduce on new_group(ranks) sums over the members only; non-members are untouched."""
    results = world.run(subgroup_all_reduce)
    ranks = members(world.world_size)
    expected = torch.full((4,), float(sum(r + 1 for r in ranks)))
    for rank, tensor in enumerate(results):
        want = expected if rank in ranks else torch.full((4,), UNTOUCHED)
        expect_tensor(tensor, want, f"subgroup all_reduce on rank {rank}")


@pytest.mark.needs(collective="all_reduce", feature="subgroups")
@pytest.mark.min_world_size(3)
def test_subgroup_non_member_call_returns_untouched(world):
    """A non-member calling a collective on the subgroup returns at once with its tensor untouched."""
    results = world.run(subgroup_non_member_call_is_a_no_op)
    ranks = members(world.world_size)
    for rank, tensor in enumerate(results):
        want = torch.full((4,), float(sum(r + 1 for r in ranks))) if rank in ranks else torch.full((4,), UNTOUCHED)
        expect_tensor(tensor, want, f"subgroup all_reduce (non-member calls it) on rank {rank}")


@pytest.mark.min_world_size(2)  # a proper subgroup needs a rank outside it
@pytest.mark.needs(collective="broadcast", feature="subgroups")
def test_subgroup_broadcast_global_root(world):
    """broadcast on a subgroup takes src as a global rank and reaches only the members."""
    results = world.run(subgroup_broadcast_from_each_member)
    ranks = members(world.world_size)
    for root in ranks:
        for rank, received in enumerate(results):
            want = values.rank_payload(root if rank in ranks else rank, 5)
            expect_tensor(received[root], want, f"subgroup broadcast from global rank {root} on rank {rank}")


@pytest.mark.min_world_size(2)  # a proper subgroup needs a rank outside it
@pytest.mark.needs(collective="all_gather", feature="subgroups")
def test_subgroup_all_gather_in_group_rank_order(world):
    """all_gather on a subgroup orders entries by group rank (members in ascending global rank)."""
    results = world.run(subgroup_all_gather)
    ranks = members(world.world_size)
    for rank, out in enumerate(results):
        if rank not in ranks:
            assert out is None
            continue
        for group_rank, global_rank in enumerate(ranks):
            expect_tensor(out[group_rank], values.rank_payload(global_rank, 3),
                          f"subgroup all_gather entry {group_rank} on rank {rank}")


@pytest.mark.min_world_size(2)  # a proper subgroup needs a rank outside it
@pytest.mark.needs(feature="subgroups")
def test_subgroup_rank_and_size(world):
    """get_rank/get_world_size/get_process_group_ranks of a subgroup reflect its members."""
    results = world.run(subgroup_rank_queries)
    ranks = members(world.world_size)
    for rank, answer in enumerate(results):
        if rank in ranks:
            assert answer == (ranks.index(rank), len(ranks), ranks), f"rank {rank}: {answer}"
        else:
            assert answer is None
