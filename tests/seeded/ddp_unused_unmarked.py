"""Seeded bug in the reference DDP: unused parameters found, but never marked ready.

With ``find_unused_parameters=True`` the reducer searches the autograd graph
for parameters this iteration did not use; they will get no gradient hook,
so the first hook must mark them ready (zeros) for their buckets to
complete. This reducer forgets to: a bucket holding an unused parameter
never launches, the reduction never finishes, every rank keeps its local
gradients and the next forward raises "Expected to have finished reduction
in the prior iteration". (When only some ranks leave the parameter unused,
the others would wait for that bucket's all-reduce: a hang, which the harness
deadline turns into a failure.)
"""

from backends.reference.ddp.reducer import Reducer
from tests.seeded.gloo_wrapper import GlooWrapper, register
from tests.seeded.planting import plant


def mark_nothing(self) -> None:
    return None  # BUG: self.unused_parameters are never marked ready


plant("ddp_unused_unmarked", Reducer, "mark_unused_parameters_ready", lambda original: mark_nothing)

DISTCONFORM_SPEC = register("ddp_unused_unmarked", GlooWrapper,
                            "gloo wrapped, reference DDP that never marks unused parameters ready")
