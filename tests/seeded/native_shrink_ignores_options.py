"""Seeded bug in the native backend: a shrink ignores the pg_options it is given.

``NativeBackend::shrink`` (native/register.cpp, planted bug ``shrink_ignores_options``)
gives the shrunk group its parent's timeout even when ``shrink_group(...,
pg_options=...)`` carries another one: a job that shrinks after a failure and
asks for a short timeout still waits the parent's long one. Caught by
suites/c10d/test_shrink_and_options.py::test_shrunk_group_times_out_as_its_options_say
(overridden: a reduction one member skips fails after the parent's 4 s, not 1.5 s).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_shrink_ignores_options", "shrink_ignores_options",
                                       "shrink_group keeps the parent's timeout over its pg_options")
