"""Seeded bug: the completion hook fires twice for every Work.

The reference backend tells its completion hooks about a finished collective
once; this one tells them again (a backend calling its hooks both from the
work's completion and from a later sweep of finished works), so a profiler
counting collectives through ``_register_on_completion_hook`` counts each one
twice. Caught by suites/c10d/test_backend_state.py::test_completion_hook_fires_once_per_work.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class CompletionHookTwice(ReferenceProcessGroup):
    """Every finished collective is reported to the completion hooks twice."""

    def _completed(self, work, seq, name):
        super()._completed(work, seq, name)
        super()._completed(work, seq, name)  # BUG: reported again


DISTCONFORM_SPEC = register_reference("completion_hook_twice", CompletionHookTwice)
