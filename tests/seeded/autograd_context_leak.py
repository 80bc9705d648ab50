"""Seeded bug: a released context is forgotten only by its creator; the workers it reached keep it forever.

The clean-up requests are never sent (a release that only erases the local
entry): every callee leaks the context, its send/recv functions and the
graph they hold. Caught by the clean-up clauses, which poll the callee for
10 s after the ``with`` block exits.
"""

from backends.reference.rpc.autograd import service
from tests.seeded.autograd_base import plant


def _local_only(original):
    def forget(context, exclude):
        running = context.backward
        if running is not None:
            running.fail("released")
        # BUG: no CLEANUP_AUTOGRAD_CONTEXT_REQ to the workers the context reached
    return forget


DISTCONFORM_SPEC = plant("autograd_context_leak", service, "_forget", _local_only)
