"""Seeded bug in the reference backend's shrink (torch 2.14 on): the shrunk group ignores the pg_options it is given.

``ReferenceProcessGroup.shrink`` gives the shrunk group its parent's timeout even when ``shrink_group(...,
pg_options=...)`` carries another one: a job that shrinks after a failure and asks for a short timeout still waits
the parent's long one (native's seeded twin: native_shrink_ignores_options). Caught by
suites/c10d/test_shrink_and_options.py::test_shrunk_group_times_out_as_its_options_say (overridden). On torch 2.13
the reference does not shrink (its gap): the gallery skips it there, saying so.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class ShrinkIgnoresOptions(ReferenceProcessGroup):
    """shrink_group keeps the parent's timeout over its pg_options."""

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts_override=None):
        return super().shrink(ranks_to_exclude, shrink_flags, None)  # BUG: the options are dropped


DISTCONFORM_SPEC = register_reference("reference_shrink_ignores_options", ShrinkIgnoresOptions)
