"""Seeded bug: the reference DistributedOptimizer waits for its owners but drops their exceptions.

``_wait_for_all`` collects every owner's answer and returns it, failed ones
included as values, instead of raising: an owner whose optimizer could not
be built (or could not step) goes unnoticed, and training "succeeds" with
some parameters never updated. Caught by the constructor-error clause: the
owner's 'Error creating optimizer.' must reach the caller.
"""

from backends.reference.rpc import optim as reference_optim
from tests.seeded.training_base import plant


def _swallow(original):
    def _wait_for_all(rpc_futs):
        results = []
        for fut in rpc_futs:
            try:
                results.append(fut.wait())
            except Exception as exc:  # BUG: kept as a result, never raised
                results.append(exc)
        return results
    return _wait_for_all


DISTCONFORM_SPEC = plant("dist_optimizer_errors_swallowed", reference_optim, "_wait_for_all", _swallow)
