"""Control: gloo behind GlooWrapper with no bug planted.

It must pass the whole suite exactly like plain gloo (same passed and xfailed
cases), so that whatever fails under a seeded module is that module's bug.

    pytest suites/ --backend-plugin tests.seeded.clean --backend gloo_wrapped
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class CleanGloo(GlooWrapper):
    """gloo, delegated unchanged."""


DISTCONFORM_SPEC = register("gloo_wrapped", CleanGloo)
