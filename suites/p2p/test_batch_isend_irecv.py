"""Contract: batch_isend_irecv.

A list of dist.P2POp (isend and irecv to and from several peers) issued as
one batch returns one Work per op (or per coalesced batch); after every Work
is waited on, each irecv holds exactly what its peer's matching isend sent.
Ops are matched per peer in list order, so with two neighbours that coincide
(world size 2) the first send to a peer meets that peer's first recv.
"""

import pytest
import torch.distributed as dist

from fixtures.rank import ctx
from suites.checks import expect_tensor
from suites.p2p.common import decoy, neighbours, payload, sent

pytestmark = [pytest.mark.needs(collective="batch_isend_irecv"), pytest.mark.min_world_size(2)]

TO_NEXT, TO_PREV = 101, 202  # salts: which direction a payload travelled
SHAPES = ["1d", "4MiB"]


# ---------------------------------------------------------------- rank side
def batch_ring_both_ways(shape_name):
    nxt, prv = neighbours(ctx.rank, ctx.world_size)
    from_prev = decoy(payload(prv, shape_name, salt=TO_NEXT))  # prev sent it to its next: us
    from_next = decoy(payload(nxt, shape_name, salt=TO_PREV))  # next sent it to its prev: us
    ops = [
        dist.P2POp(dist.isend, sent(shape_name, salt=TO_NEXT), nxt),
        dist.P2POp(dist.isend, sent(shape_name, salt=TO_PREV), prv),
        dist.P2POp(dist.irecv, from_prev, prv),
        dist.P2POp(dist.irecv, from_next, nxt),
    ]
    works = dist.batch_isend_irecv(ops)
    assert works, "batch_isend_irecv returned no Work"
    for work in works:
        work.wait()
    return from_prev.cpu(), from_next.cpu()


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("shape", SHAPES)
def test_batch_isend_irecv_ring_both_directions(world, shape):
    """batch_isend_irecv exchanges with both ring neighbours at once; every irecv gets its sender's tensor."""
    results = world.run(batch_ring_both_ways, shape)
    n = world.world_size
    for rank, (from_prev, from_next) in enumerate(results):
        nxt, prv = neighbours(rank, n)
        expect_tensor(from_prev, payload(prv, shape, salt=TO_NEXT), f"rank {rank}: irecv from previous rank {prv}")
        expect_tensor(from_next, payload(nxt, shape, salt=TO_PREV), f"rank {rank}: irecv from next rank {nxt}")
