"""Contract: a collective that one rank skips raises on the others within the group's timeout.

The group is made inside the live world with new_group(timeout=...): no world
restart, and the default group is never exposed to the timeout.

Every collective of suites/collectives.py is a case (and those whose record says
``async_entry_point``, all_reduce, once more through async_op=True and
Work.wait()). The absent rank is the last one. When data flows from a root
(broadcast, scatter) the absent rank is the root, so every other rank waits
for it and must raise. When data flows into a root
(reduce, gather) rank 0 is the root: it waits for the absent rank's
contribution and must raise; the other ranks may legitimately finish their
send without the absent rank, so they may return or raise.
"""

import pytest

from fixtures.rank import ctx
from suites import collectives
from suites.c10d.timeouts import call_while_one_rank_skips, expect_timeout_errors, issue_small

pytestmark = pytest.mark.needs(feature="group_timeout")

TIMEOUT_S = 0.5


def cases() -> list:
    """(case id, collective name, async_op) for every collective of the table, and once more with
    async_op=True (the error surfacing from Work.wait()) for those the table issues async too."""
    entries = list(collectives.TABLE.values())
    return [(c.name, c.name, False) for c in entries] + [(f"async_{c.name}", c.name, True)
                                                          for c in entries if c.async_entry_point]


def root_of(name: str, world_size: int) -> int | None:
    """The root of a rooted collective: the absent rank when data comes from it, else rank 0."""
    entry = collectives.get(name)
    if not entry.rooted:
        return None
    return 0 if entry.flow == collectives.TO_ROOT else world_size - 1


def skip_on_last_rank(name: str, async_op: bool):
    root = root_of(name, ctx.world_size)
    return call_while_one_rank_skips(lambda g: issue_small(name, g, root=root, async_op=async_op),
                                     TIMEOUT_S, absent=ctx.world_size - 1)


@pytest.mark.parametrize("operation, name, async_op", [
    pytest.param(case, name, async_op, id=case, marks=pytest.mark.needs(**collectives.get(name).need()))
    for case, name, async_op in cases()])
def test_skipped_collective_raises_within_group_timeout(world, operation, name, async_op, record_property):
    """A collective one rank never enters raises on every rank waiting for it within [timeout, timeout + 5 s]."""
    bound = [0] if collectives.get(name).flow == collectives.TO_ROOT else None  # only the root waits for it
    expect_timeout_errors(world.run(skip_on_last_rank, name, async_op), operation, TIMEOUT_S, record_property,
                          bound=bound)
