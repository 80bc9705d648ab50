"""Contract: a collective that one rank skips raises on the others within the group's timeout.

The group is made inside the live world with new_group(timeout=...): no world
restart, and the default group is never exposed to the timeout.
"""

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.c10d.timeouts import call_while_one_rank_skips, expect_timeout_errors

pytestmark = pytest.mark.needs(feature="group_timeout")

TIMEOUT_S = 0.5

OPERATIONS = {
    "all_reduce": lambda g: dist.all_reduce(torch.ones(4, device=ctx.device), group=g),
    "broadcast": lambda g: dist.broadcast(torch.ones(4, device=ctx.device), src=ctx.world_size - 1, group=g),
    "all_gather": lambda g: dist.all_gather([torch.zeros(4, device=ctx.device) for _ in range(ctx.world_size)],
                                            torch.ones(4, device=ctx.device), group=g),
    "async_all_reduce": lambda g: dist.all_reduce(torch.ones(4, device=ctx.device), group=g, async_op=True).wait(),
}


def skip_on_last_rank(name):
    return call_while_one_rank_skips(OPERATIONS[name], TIMEOUT_S, absent=ctx.world_size - 1)


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_skipped_collective_raises_within_group_timeout(world, operation, record_property):
    """A collective one rank never enters raises on every other rank within [timeout, timeout + 5 s]."""
    expect_timeout_errors(world.run(skip_on_last_rank, operation), operation, TIMEOUT_S, record_property)
