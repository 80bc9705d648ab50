"""Seeded bug in the reference backend: Work.wait(timeout) ignores its timeout.

wait() always waits as long as the group's timeout allows, so a caller that
bounds its wait on a collective a peer has not joined yet blocks instead of
getting "Timed out ...". Caught by
suites/c10d/test_work.py::test_wait_timeout_raises_on_expiry, through the
harness deadline (the ranks wait on each other), which kills the world and
fails the case with every rank's stack.
"""

from backends.reference.process_group import ReferenceWork
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class TimeoutlessWork(ReferenceWork):
    def wait(self, timeout=None):
        return super().wait(None)  # BUG: the caller's timeout is dropped


class WaitTimeoutIgnored(ReferenceProcessGroup):
    """Collectives return Works whose wait() ignores its timeout argument."""

    work_class = TimeoutlessWork


DISTCONFORM_SPEC = register_reference("reference_wait_timeout_ignored", WaitTimeoutIgnored)
