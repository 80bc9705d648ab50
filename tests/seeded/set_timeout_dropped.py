"""Seeded bug: set_timeout is kept by the group but never reaches the backend.

``group.set_timeout(t)`` records ``t`` on the Python group and returns, but the
gloo backend it delegates to keeps the timeout the group was created with: the
backend's options (``group._get_backend(cpu).options._timeout``) still report
the old value, and a collective that outlives the new timeout runs on under
the old one (the 600 s kills of issue 25, from a rebuilt group that dropped its
timeout). Caught by suites/c10d/test_capabilities.py::test_group_options_round_trip.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class SetTimeoutDropped(GlooWrapper):
    """set_timeout updates the wrapper only, not gloo."""

    def set_timeout(self, timeout):
        self.timeout = timeout  # BUG: self.inner.set_timeout(timeout) is never called


DISTCONFORM_SPEC = register("set_timeout_dropped", SetTimeoutDropped)
