"""A seeded bug for tests/test_gallery.py that crashes in its own patched code: never a catch.

Its allreduce override calls the wrapper's with an argument the wrapper does
not take (an override written against a signature the backend outgrew): the
TypeError comes from this module, in the ranks, whatever the clause checks.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class CrashesInItsPatch(GlooWrapper):
    """all_reduce raises a TypeError from its own code."""

    def allreduce(self, tensors, opts):
        return super().allreduce(tensors, opts, "an argument the wrapper does not take")  # crashes here


DISTCONFORM_SPEC = register("gallery_crashes", CrashesInItsPatch)
