"""Seeded bug in the reference backend: register_abort_hook() accepts a hook and never calls it.

A timed-out collective revokes the group (get_error() says TIMEOUT, its next collective fails) but the
abort hooks a caller registered do not run, so a fault-tolerance layer waiting on one never hears of the
fault. Caught by suites/c10d/test_fault_signals.py::test_abort_hooks_run_when_a_timeout_revokes_the_group.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class AbortHookNeverCalled(ReferenceProcessGroup):
    """Abort hooks are accepted and dropped."""

    def register_abort_hook(self, hook_id, hook):
        pass  # BUG: the hook is never kept, so never called


DISTCONFORM_SPEC = register_reference("reference_abort_hook_never_called", AbortHookNeverCalled)
