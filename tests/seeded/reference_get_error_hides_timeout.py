"""Seeded bug in the reference backend: get_error() says SUCCESS after a timeout, where the reference declares TIMEOUT.

The group records the timeout (its next collective still fails at once) but get_error() reports SUCCESS
in place of TIMEOUT, so a caller polling it never learns that the group was revoked. Caught by
suites/c10d/test_fault_signals.py::test_after_a_timeout_a_reconfigure_recovers.
"""

from torch._C._distributed_c10d import ErrorType

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class GetErrorHidesTimeout(ReferenceProcessGroup):
    """get_error() reports SUCCESS when the group timed out."""

    def get_error(self):
        error = super().get_error()
        return ErrorType.SUCCESS if error == ErrorType.TIMEOUT else error  # BUG: the timeout is hidden


DISTCONFORM_SPEC = register_reference("reference_get_error_hides_timeout", GetErrorHidesTimeout)
