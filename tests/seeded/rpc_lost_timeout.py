"""Seeded bug: the reference RPC agent loses a call's own timeout and waits the agent's default instead.

The caller passes ``timeout=`` down, but the agent files every call with the
default timeout (a plausible slip: ``timeout`` shadowed by the options'
value). Caught by the RPC timeout clauses: a call whose callee runs longer
than its 0.4 s timeout returns its value instead of failing in time.
"""

from tests.seeded.rpc_base import bind, plant


def _forget_timeout(original):
    def call(self, *args, **kwargs):
        bound = bind(original, self, args, kwargs)
        bound.arguments["timeout"] = self.default_timeout  # BUG: the call's own timeout is dropped
        return original(*bound.args, **bound.kwargs)
    return call


DISTCONFORM_SPEC = plant("rpc_lost_timeout", "call", _forget_timeout)
