"""Seeded bug: all_reduce reports success, with its input left as it was, when the network fails under it.

The wrapper waits for gloo's all_reduce and, when it raises (a timeout or a reset connection under a network
fault), returns a completed Work instead: the caller carries on with stale data and no error. Caught by the
fault clause that holds every rank to an error under a partition (suites/faults/test_network_faults.py).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register


class SwallowsNetworkErrors(GlooWrapper):
    """allreduce: a failure of gloo's is swallowed, the output left stale."""

    def allreduce(self, tensors, opts=None):
        work = super().allreduce(tensors, opts)
        try:
            work.wait()
        except RuntimeError:
            return completed_work()
        return work


DISTCONFORM_SPEC = register("gloo_swallows_network_errors", SwallowsNetworkErrors)
