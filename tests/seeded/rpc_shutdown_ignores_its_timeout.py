"""Seeded bug: graceful shutdown ignores the timeout it was given and waits for the other workers without bound.

``shutdown(graceful=True, timeout=2)`` waits as ``timeout=0`` does (a plausible slip: the timeout is dropped on
its way to the wait). Under a partition, with a call in flight across it, the workers' message counts never
balance and shutdown never returns. Caught by the fault clause holding graceful shutdown to its timeout.
"""

from tests.seeded.rpc_base import bind, plant


def _unbounded(original):
    def wait_all_workers(self, *args, **kwargs):
        bound = bind(original, self, args, kwargs)
        bound.arguments["timeout"] = 0  # BUG: the caller's timeout is lost: wait as long as it takes
        return original(*bound.args, **bound.kwargs)
    return wait_all_workers


DISTCONFORM_SPEC = plant("rpc_shutdown_ignores_its_timeout", "_wait_all_workers", _unbounded)
