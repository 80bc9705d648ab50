"""Seeded bug: a plugin backend that leaves collective checking to torch's DETAIL wrapper, which never sees it.

torch 2.13 wraps a backend in its ProcessGroupWrapper (fingerprint checks)
only when the backend's creator returns a c10d Backend; a creator returning
a ProcessGroup subclass (like this gloo wrapper, or the reference) is used
as is. This one does no agreement check of its own, so under
TORCH_DISTRIBUTED_DEBUG=DETAIL mismatched shapes still reach gloo, which
aborts a rank or returns silently. Caught by
suites/parallel/test_debug.py::test_detail_reports_shape_mismatch at
--debug-level DETAIL (plain gloo passes it, wrapped by torch).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class DebugUnwrappedGloo(GlooWrapper):
    """gloo behind a ProcessGroup subclass: no fingerprint check under DETAIL (torch does not wrap it)."""


DISTCONFORM_SPEC = register("debug_unwrapped_gloo", DebugUnwrappedGloo)
