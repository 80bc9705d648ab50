"""Contract: a collective over more than 2**31 elements gives the exact result (no 32-bit count overflow).

Open MPI's big-count tests cross 2**31 elements; a backend that keeps a count or a byte offset in a
32-bit integer truncates, wraps or refuses there. Each rank all_reduces (SUM) and broadcasts an int8
tensor of 2**31 + 3 elements (about 2.2 GB per buffer) and checks every element, the ones past 2**31
included, chunk by chunk. The case needs several such buffers per rank (the tensor and the backend's
own scratch), so it runs only when the host's available memory allows it, and only under the soak
marker.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx

NUMEL = 2**31 + 3
BUFFERS_PER_RANK = 3  # the tensor, a backend's scratch of the same size, and slack for the checks
CHECK_CHUNK = 2**26  # elements compared at once: the bool result stays small


def _available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _first_wrong(tensor: torch.Tensor, expected: int) -> int | None:
    for start in range(0, tensor.numel(), CHECK_CHUNK):
        chunk = tensor[start:start + CHECK_CHUNK]
        wrong = (chunk != expected).nonzero()
        if wrong.numel():
            return start + int(wrong[0])
    return None


def big_count_on_rank(numel: int) -> dict:
    """{collective: first wrong index or None} for an all_reduce and a broadcast of ``numel`` int8."""
    found = {}
    tensor = torch.ones(numel, dtype=torch.int8, device=ctx.device)
    tensor[-1] = 2  # the last element differs: a wrapped count would not reach it
    dist.all_reduce(tensor)
    tensor[:-1] -= ctx.world_size  # every element now 0 where the sum was exact
    tensor[-1] -= 2 * ctx.world_size
    found["all_reduce"] = _first_wrong(tensor, 0)
    tensor.fill_(7 if ctx.rank == 0 else 0)
    dist.broadcast(tensor, 0)
    found["broadcast"] = _first_wrong(tensor, 7)
    del tensor
    return found


pytestmark = pytest.mark.needs(feature="big_count", collective="all_reduce", dtype="int8")


@pytest.mark.soak
@pytest.mark.deadline(600)
def test_collectives_over_2_pow_31_elements(world, record_property):
    """all_reduce and broadcast of more than 2**31 int8 elements are exact to the last element."""
    needed = world.world_size * BUFFERS_PER_RANK * NUMEL
    available = _available_bytes()
    if available < needed:
        pytest.skip(f"{NUMEL} int8 elements need about {needed / 2**30:.1f} GiB for {world.world_size} ranks "
                    f"({BUFFERS_PER_RANK} buffers each); this host has {available / 2**30:.1f} GiB available")
    results = world.run(big_count_on_rank, NUMEL)
    for rank, found in enumerate(results):
        for collective, index in found.items():
            assert index is None, (f"rank {rank}: {collective} of {NUMEL} int8 elements is wrong from element "
                                   f"{index} on ({'past' if index >= 2**31 else 'before'} 2**31)")
    record_property("finding", f"{NUMEL} int8 elements (> 2**31): all_reduce and broadcast exact on every rank")
