"""Seeded bug in the native backend: the group's timeout never fires.

The worker thread (native/collectives.cpp, planted bug ``no_timeout``) waits
for its peers with no deadline, so a collective one rank skips blocks
forever instead of raising. Caught by the timeout contract through the
harness deadline, which kills the hung world and fails the case
(suites/c10d/test_timeouts.py::test_skipped_collective_raises_within_group_timeout).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_no_timeout", "no_timeout", "the group timeout never fires")

