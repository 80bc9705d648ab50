"""Seeded bug in the native backend: a collective's Work completes before its data has landed.

The worker thread (native/collectives.cpp, planted bug ``early_completion``)
marks the Work and its future complete when it *starts* a collective, so
``wait()`` on an async collective returns while the result is still being
written (a blocking call runs in the caller's thread and is unaffected).
Caught every time by suites/c10d/test_work.py::test_future_completes_after_the_data_has_landed:
a callback on the Work's future copies the output when the future completes,
and the last rank joins late, so the copy holds the rank's own input. (The
async all_reduce clause in test_all_reduce.py catches it only when the worker
thread wins the race with wait(), which runs a still-queued job itself.)
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_early_completion", "early_completion",
                                       "Works complete before the copy-out")
