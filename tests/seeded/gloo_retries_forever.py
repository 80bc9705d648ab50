"""Seeded bug: all_reduce retries a broken connection forever instead of raising.

The wrapper waits for gloo's all_reduce and, when it raises (a timeout or a reset under a network fault), issues
it again, and again: once gloo has closed the group's pairs every retry fails at once, so the call never
returns, healed or not. Caught by the fault clause that bounds every wait by its timeout plus the slack
(suites/faults/test_network_faults.py).
"""

import time

from tests.seeded.gloo_wrapper import GlooWrapper, register

RETRY_PAUSE_S = 0.05


class RetriesForever(GlooWrapper):
    """allreduce: a failed call is issued again until it succeeds."""

    def allreduce(self, tensors, opts=None):
        while True:
            work = super().allreduce(tensors, opts)
            try:
                work.wait()
                return work
            except RuntimeError:
                time.sleep(RETRY_PAUSE_S)


DISTCONFORM_SPEC = register("gloo_retries_forever", RetriesForever)
