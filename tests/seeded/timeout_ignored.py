"""Seeded bug: the group's timeout is ignored; a collective a peer skips blocks forever.

The backend drops the ``timeout`` its group is created with
(``new_group(timeout=...)``, ``init_process_group(timeout=...)``) and waits
for peers without a limit, so a collective one rank never enters hangs
instead of raising. Caught by the timeout contract (a collective
one rank skips must raise within the group's timeout), through the harness
deadline, which kills the hung world and fails the case with every rank's
stack (suites/c10d/test_timeouts.py::test_skipped_collective_raises_within_group_timeout,
suites/c10d/test_barrier.py::test_barrier_skipped_by_one_rank_times_out; with
``-x`` the first to fail is test_bad_input's mismatched-collectives case, which
must also end within the deadline).
"""

from tests.seeded.gloo_wrapper import LONG_TIMEOUT, GlooWrapper, register


class TimeoutIgnored(GlooWrapper):
    """gloo is built with a one-day timeout whatever the group asked for."""

    def inner_timeout(self, timeout):
        return LONG_TIMEOUT


DISTCONFORM_SPEC = register("timeout_ignored", TimeoutIgnored)

