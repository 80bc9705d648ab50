"""Seeded bug: isend returns only once the message is delivered (a send with rendezvous semantics).

A backend whose send writes the whole message before it returns the Work: fine while the receiver has posted its
recv, but a process that isends first and then does something its peer waits on (here: says so in the store)
deadlocks with it until the timeout. Caught by the p2p clause that has the receiver post its recv only after the
sender's isend returned.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class IsendWaitsForTheReceiver(GlooWrapper):
    """send waits for its own Work before returning it."""

    def send(self, tensors, dst, tag):
        work = super().send(tensors, dst, tag)
        work.wait()  # BUG: the caller's isend blocks until the receiver took the message
        return work


DISTCONFORM_SPEC = register("isend_waits_for_the_receiver", IsendWaitsForTheReceiver)
