"""Seeded bug in the dcdev backend: a Work completes before its results are copied back onto the device.

The staging backend (native/device/staged.cpp, planted bug ``early_completion``) completes the Work when the
host algorithm has finished and copies the results onto the device only when the Work is destroyed. A
blocking call drops its Work before returning, so it is unaffected; after ``wait()`` on an async call the
device tensor still holds the rank's own input: suites/c10d/test_all_reduce.py::test_all_reduce_async.
"""

from tests.seeded.dcdev_base import register_dcdev_bug

DISTCONFORM_SPEC = register_dcdev_bug("dcdev_early_completion", "early_completion",
                                      "Works complete before the copy back onto the device")
