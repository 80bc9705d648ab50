"""Seeded bug in the reference DDP: under Join, gradients always divided by the initial world size.

With ``join(divide_by_initial_world_size=False)`` the reducer must divide the
summed gradients by the number of ranks still training, which the Join
context's all-reduce of ones in each forward counts. This reducer ignores
that count and always divides by the group size, so once a rank has joined
the others' gradients come out too small (25 instead of 50 in the spec's D8).
"""

import torch.distributed as dist

from backends.reference.ddp.reducer import UNSET_DIV_FACTOR, Reducer
from tests.seeded.gloo_wrapper import GlooWrapper, register
from tests.seeded.planting import plant


def set_divide_factor_ignoring_join(self) -> None:
    if self.div_factor == UNSET_DIV_FACTOR:
        self.div_factor = dist.get_world_size(self.process_group)  # BUG: the join count is never read


plant("ddp_join_divide_factor", Reducer, "set_divide_factor", lambda original: set_divide_factor_ignoring_join)

DISTCONFORM_SPEC = register("ddp_join_divide_factor", GlooWrapper,
                            "gloo wrapped, reference DDP dividing by the initial world size under Join")
