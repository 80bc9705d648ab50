"""Seeded bug: graceful shutdown gives up on late workers after the RPC timeout.

``shutdown(timeout=0)`` (none) waits for the other workers' counts only as
long as the agent's RPC timeout (a plausible slip: the wait falls back to
the default timeout, as the store's own wait did). Caught by the shutdown
clause whose rank 1 reaches shutdown three RPC timeouts late.
"""

from tests.seeded.rpc_base import bind, plant


def _rpc_timeout_bound(original):
    def wait_all_workers(self, *args, **kwargs):
        bound = bind(original, self, args, kwargs)
        bound.arguments["timeout"] = bound.arguments["timeout"] or self.default_timeout  # BUG: "none" is not none
        return original(*bound.args, **bound.kwargs)
    return wait_all_workers


DISTCONFORM_SPEC = plant("rpc_shutdown_inherits_rpc_timeout", "_wait_all_workers", _rpc_timeout_bound)
