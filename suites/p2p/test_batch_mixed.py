"""Contract: batch_isend_irecv with sends and receives to several peers mixed in one batch.

One batch may hold, in any order, isends and irecvs to and from every other
rank, several messages to the same peer, tensors of different dtypes and
sizes, or only sends on some ranks and only receives on another (fan-in).
After every returned Work is waited on, each irecv holds exactly what its
peer's matching isend sent; messages between one pair of ranks match in list
order. The ops are interleaved in a rank-dependent order, so a backend that
needs sends before receives (or posts them in a fixed peer order and
deadlocks) fails here instead of in a user's pipeline schedule.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import values
from suites.checks import expect_tensor
from suites.p2p.common import decoy

pytestmark = [pytest.mark.needs(collective="batch_isend_irecv"), pytest.mark.min_world_size(2)]


def message(src: int, dst: int, index: int = 0, dtype: str = "float32") -> torch.Tensor:
    """What ``src`` sends ``dst`` as its message number ``index``: says who, to whom, which, and has its own size."""
    return values.rank_payload(src, 3 + dst + 2 * index, dtype, salt=100 * dst + 10 * index)


def run_batch(ops) -> None:
    works = dist.batch_isend_irecv(ops)
    assert works, "batch_isend_irecv returned no Work"
    for work in works:
        work.wait()


# ---------------------------------------------------------------- rank side
def all_pairs_shuffled(per_peer: int):
    """Every rank sends ``per_peer`` messages to every other rank and receives as many, in one shuffled batch."""
    me, n = ctx.rank, ctx.world_size
    sends, recvs, received = [], [], {}
    for peer in range(n):
        if peer == me:
            continue
        for index in range(per_peer):
            sends.append(dist.P2POp(dist.isend, message(me, peer, index).to(ctx.device), peer))
            buffer = decoy(message(peer, me, index))
            received[(peer, index)] = buffer
            recvs.append(dist.P2POp(dist.irecv, buffer, peer))
    # Interleave, keeping each peer's sends (and recvs) in index order: that order is the contract.
    rng = random.Random(1000 + me)
    ops, queues = [], [list(sends), list(recvs)]
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        ops.append(queue.pop(0))
    run_batch(ops)
    return {key: t.cpu() for key, t in received.items()}


def fan_in_to_rank_zero():
    """Rank 0's batch holds only irecvs (one per other rank, two dtypes); the others' only isends."""
    me, n = ctx.rank, ctx.world_size
    if me == 0:
        received = {}
        ops = []
        for peer in reversed(range(1, n)):
            for dtype in ("float64", "int32"):
                received[(peer, dtype)] = decoy(message(peer, 0, dtype=dtype))
                ops.append(dist.P2POp(dist.irecv, received[(peer, dtype)], peer))
        run_batch(ops)
        return {key: t.cpu() for key, t in received.items()}
    run_batch([dist.P2POp(dist.isend, message(me, 0, dtype=dtype).to(ctx.device), 0)
               for dtype in ("float64", "int32")])
    return None


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("per_peer", [1, 3])
def test_batch_all_pairs_mixed_order(world, per_peer):
    """One batch of interleaved isends and irecvs with every other rank delivers each message to its irecv."""
    n = world.world_size
    for rank, received in enumerate(world.run(all_pairs_shuffled, per_peer)):
        assert len(received) == (n - 1) * per_peer
        for (peer, index), got in received.items():
            expect_tensor(got, message(peer, rank, index), f"rank {rank}: message {index} from rank {peer}")


def test_batch_fan_in_receives_only(world):
    """A batch of only irecvs on one rank meets batches of only isends on the others, message for message."""
    results = world.run(fan_in_to_rank_zero)
    for (peer, dtype), got in results[0].items():
        expect_tensor(got, message(peer, 0, dtype=dtype), f"rank 0: {dtype} message from rank {peer}")
