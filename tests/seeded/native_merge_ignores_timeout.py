"""Seeded bug in the native backend: a merged group keeps its parent's timeout, not the one merge was given.

``NativeBackend::merge`` (native/register.cpp, planted bug ``merge_ignores_timeout``)
builds the merged group with the timeout of the group it merges from, whatever
``ProcessGroup.merge_remote_group(store, size, timeout, ...)`` asked for: the
rebuilt-group-drops-its-timeout failure of issue 25, where a job waits its old
long timeout after reassembling. Caught by
suites/c10d/test_shrink_and_options.py::test_merge_remote_group (a reduction one
member skips fails after the one-rank group's 8 s, not merge's 3 s).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_merge_ignores_timeout", "merge_ignores_timeout",
                                       "merge_remote_group keeps the parent's timeout over the one it was given")
