"""Seeded bug in the native backend: a shrunk group still counts the ranks it excluded.

``NativeBackend::shrink`` (native/register.cpp, planted bug ``shrink_waits_for_excluded``)
makes the shrunk group with the excluded ranks still among its members, so
building it waits for them to attach: after a rank died, the survivors' shrink
waits for the dead rank until the parent's timeout instead of giving them a
working group. Caught by
suites/c10d/test_shrink_and_options.py::test_shrink_after_a_rank_was_killed (through
the harness deadline), and test_shrink_the_default_group alike.
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_shrink_waits_for_excluded", "shrink_waits_for_excluded",
                                       "shrink_group waits for the ranks it excluded")

