"""Seeded bug: recv reports success, its buffer left as it was, when the network fails under it.

The wrapper waits for gloo's recv and, when it raises (a timeout or a reset under a network fault), returns a
completed Work instead: the receiver carries on with whatever its buffer held. Caught by the fault clause that
holds every rank a fault reaches to an error (suites/faults/test_network_faults.py, p2p).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register


class RecvSwallowsNetworkErrors(GlooWrapper):
    """recv: a failure of gloo's is swallowed, the buffer left stale."""

    def recv(self, tensors, src, tag):
        work = super().recv(tensors, src, tag)
        try:
            work.wait()
        except RuntimeError:
            pass  # the bug: swallowed
        # a completed Work either way: waiting twice on gloo's recv Work waits for a second message
        return completed_work(tensors)


DISTCONFORM_SPEC = register("gloo_recv_swallows_network_errors", RecvSwallowsNetworkErrors)
