"""Seeded bug: the backend caps every timeout at its own short one; a group asking for longer times out early.

gloo is built with the group's timeout (so connecting gets all of it), then its
collectives' timeout is cut to CAP_S whatever the group asked for: a backend
that applies its own default instead of a longer requested one. A collective
that one rank skips on a group with a shorter timeout still raises on time, so
the timeout clause itself passes; caught by its negative twin (a rank 1.5 s
late on a group with a 6 s timeout must not make the others raise,
suites/c10d/test_timeouts.py::test_late_rank_within_group_timeout_succeeds) and
by the Work.wait(timeout) twin (test_wait_timeout_outlasted_by_a_late_rank_returns).
"""

from datetime import timedelta

from tests.seeded.gloo_wrapper import GlooWrapper, register

CAP_S = 1.0


class TimeoutCapped(GlooWrapper):
    """gloo's collectives wait at most 1 s, whatever timeout the group was created with."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(store, rank, size, timeout)
        self.inner.set_timeout(min(timeout, timedelta(seconds=CAP_S)))


DISTCONFORM_SPEC = register("timeout_capped", TimeoutCapped)
