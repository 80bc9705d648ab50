"""Contract: object collectives move arbitrary picklable Python objects.

Objects of different sizes per rank (so a backend or size exchange that
assumes equal lengths fails), nested containers, and tensors inside objects.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx

pytestmark = pytest.mark.needs(feature="object_collectives")


def make_object(rank):
    """Rank-specific, with a rank-dependent size and a tensor inside."""
    return {"rank": rank, "text": "x" * (10 + 37 * rank), "nested": [rank, (rank, str(rank))],
            "tensor": torch.arange(3) + rank}


def same(a, b):
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


# ---------------------------------------------------------------- rank side
def all_gather_object():
    out = [None] * ctx.world_size
    dist.all_gather_object(out, make_object(ctx.rank))
    return out


def broadcast_object_list_from_every_root():
    received = {}
    for root in range(ctx.world_size):
        objects = [make_object(ctx.rank), f"from {ctx.rank}"]
        dist.broadcast_object_list(objects, src=root)
        received[root] = objects
    return received


def gather_object_to_every_root():
    at_root = {}
    for root in range(ctx.world_size):
        out = [None] * ctx.world_size if ctx.rank == root else None
        dist.gather_object(make_object(ctx.rank), out, dst=root)
        if ctx.rank == root:
            at_root[root] = out
    return at_root


def scatter_object_list_from_every_root():
    received = {}
    for root in range(ctx.world_size):
        inputs = [make_object(100 * root + dest) for dest in range(ctx.world_size)] if ctx.rank == root else None
        out = [None]
        dist.scatter_object_list(out, inputs, src=root)
        received[root] = out[0]
    return received


# ------------------------------------------------------------------ clauses
def test_all_gather_object(world):
    """all_gather_object: entry i on every rank equals rank i's object (objects of different sizes)."""
    for rank, out in enumerate(world.run(all_gather_object)):
        for source in range(world.world_size):
            assert same(out[source], make_object(source)), f"rank {rank} entry {source}: {out[source]!r}"


def test_broadcast_object_list(world):
    """broadcast_object_list(src=root) gives every rank the root's list, for every root."""
    for rank, received in enumerate(world.run(broadcast_object_list_from_every_root)):
        for root in range(world.world_size):
            objects = received[root]
            assert same(objects[0], make_object(root)) and objects[1] == f"from {root}", \
                f"rank {rank}, root {root}: {objects!r}"


def test_gather_object(world):
    """gather_object(dst=root): entry i at the root is rank i's object, for every root."""
    results = world.run(gather_object_to_every_root)
    for root in range(world.world_size):
        for source, obj in enumerate(results[root][root]):
            assert same(obj, make_object(source)), f"root {root} entry {source}: {obj!r}"


def test_scatter_object_list(world):
    """scatter_object_list(src=root): rank i receives entry i of the root's list, for every root."""
    for rank, received in enumerate(world.run(scatter_object_list_from_every_root)):
        for root in range(world.world_size):
            assert same(received[root], make_object(100 * root + rank)), \
                f"rank {rank} from root {root}: {received[root]!r}"
