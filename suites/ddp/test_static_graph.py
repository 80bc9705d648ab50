"""Contract: static_graph.

With ``static_graph=True`` iteration 1 only records which parameters get
gradients; parameters unused then stay unused for good (.grad None) and the
used ones match the baseline every iteration; a parameter that starts being
used later is an error naming the change: "Your training graph has changed in
this iteration" (spec A8). Gradient equality in static mode over several
steps is also a mode of suites/ddp/test_gradients.py.
"""

import pytest
import torch

from fixtures.rank import ctx
from suites.ddp import common, impls, models

pytestmark = pytest.mark.needs(feature="ddp")

GRAPH_CHANGED = "Your training graph has changed in this iteration"


# ---------------------------------------------------------------- rank side
def q_joins_late(impl, quiet_iterations=2):
    """RankBranch in static mode: q unused for ``quiet_iterations`` iterations, then used by every rank."""
    ddp = impls.wrap(impl, models.RankBranch(), static_graph=True)
    x = torch.ones(1, 3, device=common.device()) * (ctx.rank + 1)
    events = []
    for it in range(quiet_iterations + 1):
        for p in ddp.parameters():
            p.grad = None
        try:
            ddp(x, use_q=it >= quiet_iterations).sum().backward()
        except RuntimeError as exc:
            events.append(("error", str(exc)))
            break
        events.append(("grads", models.grads_of(ddp.module)))
    return events


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("impl", impls.impl_params())
def test_static_graph_unused_stay_unused_and_late_use_raises(world, impl):
    """static_graph: q and z unused in iteration 1 keep .grad None in later iterations while p averages; q used from iteration 3 raises "Your training graph has changed in this iteration" on every rank."""
    n = world.world_size
    mean_p = sum(range(1, n + 1)) / n
    for rank, events in enumerate(world.run(q_joins_late, impl)):
        what = f"{impl} DDP rank {rank}"
        assert [kind for kind, _ in events] == ["grads", "grads", "error"], f"{what}: events {events}"
        for it, (_, grads) in enumerate(events[:2]):
            assert grads["q.weight"] is None and grads["z.weight"] is None, \
                f"{what} iteration {it}: unused q/z got grads {grads}"
            assert torch.allclose(grads["p.weight"], torch.full((1, 3), mean_p), atol=1e-6), \
                f"{what} iteration {it}: p.grad {grads['p.weight']}, expected {mean_p}"
        assert GRAPH_CHANGED in events[2][1], f"{what}: late use of q raised {events[2][1]!r}"
