"""Seeded bug in the reference backend: every group starts a thread that never ends.

Each new group starts a housekeeping thread that waits on an event nobody sets, so destroying the group
(and collecting it) leaves one OS thread behind per group; a process that creates groups in a loop runs
out of threads. Caught by suites/soak/test_churn.py::test_threaded_create_destroy_leaves_nothing: after
24 groups created and destroyed from three threads the rank holds 24 more threads than before.
"""

import threading

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class ThreadPerGroup(ReferenceProcessGroup):
    """A thread per group that outlives it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        never = threading.Event()
        threading.Thread(target=never.wait, name="reference-housekeeping", daemon=True).start()  # BUG


DISTCONFORM_SPEC = register_reference("reference_thread_per_group", ThreadPerGroup)
