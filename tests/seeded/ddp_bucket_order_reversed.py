"""Seeded bug in the reference DDP: buckets handed to the reducer in assignment order, not reversed.

``compute_bucket_assignment_by_size`` sorts buckets by their lowest parameter
index; DDP must reverse that list, because backward produces the gradients
of the last-defined parameters first and the reducer launches bucket 0
first. This reducer keeps the assignment order, so the bucket holding the
first parameters (whose gradients arrive last) is bucket 0 and every other
bucket waits behind it: no overlap of communication with backward.
Gradients stay right (every rank launches the same order), which is why
only the bucket-layout clause catches it.
"""

import backends.reference.ddp.data_parallel as data_parallel
from tests.seeded.gloo_wrapper import GlooWrapper, register
from tests.seeded.planting import plant


def assignment_order(assignment: list) -> list:
    return list(assignment)  # BUG: not reversed


plant("ddp_bucket_order_reversed", data_parallel, "reducer_order", lambda original: assignment_order)

DISTCONFORM_SPEC = register("ddp_bucket_order_reversed", GlooWrapper,
                            "gloo wrapped, reference DDP with buckets in assignment order (not reversed)")
