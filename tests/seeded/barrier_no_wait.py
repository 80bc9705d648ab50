"""Seeded bug: barrier does not wait for the other ranks.

barrier returns an already completed Work without talking to anybody, so a
rank passes the barrier while its peers are still busy. Every other
collective is correct. Caught by a barrier clause that makes one rank arrive
late and checks that nobody leaves before it arrives.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register


class BarrierNoWait(GlooWrapper):
    """barrier returns a completed Work at once."""

    def barrier(self, opts=None):
        return completed_work()


DISTCONFORM_SPEC = register("barrier_no_wait", BarrierNoWait)
