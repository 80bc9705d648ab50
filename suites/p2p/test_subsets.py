"""Contract: point-to-point among some ranks, and inside subgroups.

Two ranks can exchange messages while every other rank stays idle (makes no
call at all): p2p is not a collective. Inside a subgroup created with
dist.new_group(ranks=...), peers are addressed either by group rank
(group_dst/group_src) or by global rank (dst/src with group=); either way the
message arrives from the right rank and recv returns the sender's global rank,
also when it received from any source. Ranks outside the subgroup take no part.
"""

import pytest
import torch.distributed as dist

from fixtures.rank import ctx
from suites.checks import expect_tensor
from suites.p2p.common import decoy, neighbours, payload, sent, subgroup

pytestmark = [pytest.mark.needs(collective="send_recv"), pytest.mark.min_world_size(2)]

ROUNDS = 3
PAIR_SALT, GROUP_SALT = 7, 70


# ---------------------------------------------------------------- rank side
def ping_pong(first, second, rounds, salt):
    """``first`` and ``second`` ping-pong ``rounds`` times; every other rank returns None at once."""
    if ctx.rank not in (first, second):
        return None
    peer = second if ctx.rank == first else first
    received = []
    for i in range(rounds):
        outgoing = sent(salt=salt + i)
        incoming = decoy(payload(peer, salt=salt + i))
        if ctx.rank == first:
            dist.send(outgoing, peer)
            source = dist.recv(incoming, peer)
        else:
            source = dist.recv(incoming, peer)
            dist.send(outgoing, peer)
        received.append((source, incoming.cpu()))
    return received


def subgroup_ranks(world_size):
    """Ranks 1..n-1 (group rank != global rank) when there are 3 ranks or more, else both."""
    return list(range(1, world_size)) if world_size >= 3 else [0, 1]


def group_ring(addressing, salt):
    """A blocking ring inside the subgroup; even group ranks send first."""
    ranks = subgroup_ranks(ctx.world_size)
    group = subgroup(ranks)  # every rank creates it, members or not
    if ctx.rank not in ranks:
        return None
    group_rank = dist.get_rank(group)
    assert group_rank == ranks.index(ctx.rank), \
        f"dist.get_rank(subgroup) is {group_rank} on global rank {ctx.rank}, expected {ranks.index(ctx.rank)}"
    nxt, prv = neighbours(group_rank, len(ranks))
    outgoing = sent(salt=salt)
    incoming = decoy(payload(ranks[prv], salt=salt))

    def send():
        if addressing == "group_rank":
            dist.send(outgoing, group=group, group_dst=nxt)
        else:
            dist.send(outgoing, dst=ranks[nxt], group=group)

    def recv():
        if addressing == "group_rank":
            return dist.recv(incoming, group=group, group_src=prv)
        if addressing == "global_rank":
            return dist.recv(incoming, src=ranks[prv], group=group)
        return dist.recv(incoming, group=group)  # any source: only prev sends to us

    if group_rank % 2 == 0:
        send()
        source = recv()
    else:
        source = recv()
        send()
    return source, incoming.cpu()


# ------------------------------------------------------------------ clauses
def check_ping_pong(results, first, second, salt):
    for rank, got in enumerate(results):
        if rank not in (first, second):
            assert got is None, f"idle rank {rank} returned {got!r}"
            continue
        peer = second if rank == first else first
        assert len(got) == ROUNDS
        for i, (source, tensor) in enumerate(got):
            assert source == peer, f"round {i}: recv on rank {rank} reported sender {source}, expected {peer}"
            expect_tensor(tensor, payload(peer, salt=salt + i), f"round {i}: rank {rank} from rank {peer}")


def test_pair_talks_while_others_idle(world):
    """Ranks 0 and 1 exchange messages while every other rank makes no call."""
    results = world.run(ping_pong, 0, 1, ROUNDS, PAIR_SALT)
    check_ping_pong(results, 0, 1, PAIR_SALT)


@pytest.mark.min_world_size(3)
def test_pair_talks_while_rank0_idles(world):
    """Ranks 1 and 2 exchange messages while rank 0 (and any other rank) makes no call."""
    results = world.run(ping_pong, 1, 2, ROUNDS, PAIR_SALT)
    check_ping_pong(results, 1, 2, PAIR_SALT)


@pytest.mark.parametrize("addressing", [
    "group_rank",
    "global_rank",
    pytest.param("any_source", marks=pytest.mark.needs(feature="recv_any_source")),
])
def test_subgroup_send_recv(world, addressing):
    """send/recv inside a new_group subgroup reaches the right member; recv returns the global sender rank."""
    results = world.run(group_ring, addressing, GROUP_SALT)
    ranks = subgroup_ranks(world.world_size)
    for rank, got in enumerate(results):
        if rank not in ranks:
            assert got is None, f"rank {rank} is outside the subgroup {ranks} but returned {got!r}"
            continue
        _, prv = neighbours(ranks.index(rank), len(ranks))
        source, tensor = got
        assert source == ranks[prv], (f"recv ({addressing}) on global rank {rank} returned sender {source}, "
                                      f"expected global rank {ranks[prv]}")
        expect_tensor(tensor, payload(ranks[prv], salt=GROUP_SALT),
                      f"subgroup {ranks} ({addressing}): global rank {rank} from global rank {ranks[prv]}")
