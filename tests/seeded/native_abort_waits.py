"""Seeded bug in the native backend: abort() leaves a collective in flight waiting until its deadline.

The worker's waits never look at the abort flag (native/segment.cpp,
planted bug ``abort_waits``), so ``_abort_process_group`` blocks in shutdown
until the pending all_reduce times out (the group's 6 s) and only then fails
it. Caught by the lifecycle contract, which times the abort and the wait
together (suites/c10d/test_lifecycle.py::test_abort_fails_pending_work).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_abort_waits", "abort_waits",
                                       "abort leaves in-flight collectives waiting until their deadline")
