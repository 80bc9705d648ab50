"""Seeded bug: once an all_reduce failed under a network fault, later ones report success with stale outputs.

The first failure is raised as gloo raises it; the group then remembers it and answers every later all_reduce
with a completed Work, its input left as it was: after healing the caller carries on with stale data and no
error, where gloo's group raises at once (its declared after_timeout). Caught by the fault clause that holds the
group after healing to its declaration (suites/faults/test_network_faults.py).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register


class StaleAfterPartition(GlooWrapper):
    """allreduce: after one failure, success without reducing."""

    failed = False

    def allreduce(self, tensors, opts=None):
        if self.failed:
            return completed_work(tensors)
        work = super().allreduce(tensors, opts)
        try:
            work.wait()
        except RuntimeError:
            self.failed = True
            raise
        return work


DISTCONFORM_SPEC = register("gloo_stale_after_partition", StaleAfterPartition)
