"""Contract: send and recv touch exactly the tensors they were given.

Both tensors sit at a storage offset in a larger buffer with slack after them
(suites/guard_regions.py): the received tensor holds the sender's data, the
slack around it and around the sent tensor is unchanged, and the sent
tensor is unchanged. An empty message is received into an empty tensor
right next to its guards. (The collectives' guard clauses:
suites/c10d/test_memory_safety.py.)
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from fixtures.rank import ctx
from suites.guard_regions import expect_guarded, guarded, unwritten, values_of
from suites.p2p.common import neighbours

pytestmark = [pytest.mark.needs(collective="send_recv"), pytest.mark.min_world_size(2)]

SHAPES = {"1d": (5,), "empty": (0,)}


# ---------------------------------------------------------------- rank side
def ring_guarded(dtype: str, shape_name: str):
    """isend to the next rank, irecv from the previous one, both tensors guarded; (sent buffer, received buffer)."""
    nxt, prv = neighbours(ctx.rank, ctx.world_size)
    shape = SHAPES[shape_name]
    outgoing, out_buffer = guarded(values_of(dtype, ctx.rank, nxt, shape), ctx.device)
    incoming, in_buffer = guarded(unwritten(dtype, shape), ctx.device)
    receiving = dist.irecv(incoming, prv)
    sending = dist.isend(outgoing, nxt)
    sending.wait()
    receiving.wait()
    return out_buffer.cpu(), in_buffer.cpu()


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("shape", [pytest.param(name, id=name, marks=pytest.mark.needs(shape=name)) for name in SHAPES])
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_send_recv_guard_regions(world, dtype, shape):
    """send/recv write only the receiving tensor: guards around both tensors unchanged, the sent tensor unchanged."""
    n = world.world_size
    for rank, (out_buffer, in_buffer) in enumerate(world.run(ring_guarded, dtype, shape)):
        nxt, prv = neighbours(rank, n)
        expect_guarded(out_buffer, values_of(dtype, rank, nxt, SHAPES[shape]),
                       f"the tensor rank {rank} sent to rank {nxt} (unchanged)")
        expect_guarded(in_buffer, values_of(dtype, prv, rank, SHAPES[shape]),
                       f"the tensor rank {rank} received from rank {prv}")
