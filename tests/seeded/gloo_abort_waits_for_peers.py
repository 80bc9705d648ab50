"""Seeded bug: abort() first waits for the peers to agree, so during a partition it never returns.

Before aborting gloo, the wrapper runs a barrier on the group and tries again until one succeeds ("tell the
peers first"); while a host is cut off, or once gloo has closed the pairs, none does. Caught by the fault clause
that bounds abort() during a fault (suites/faults/test_network_faults.py).
"""

import time

from tests.seeded.gloo_wrapper import GlooWrapper, register


class AbortWaitsForPeers(GlooWrapper):
    """abort: a barrier with the peers first, retried until it succeeds."""

    def abort(self):
        while True:
            try:
                self.inner.barrier().wait()
                break
            except RuntimeError:
                time.sleep(0.05)
        return self.inner.abort()


DISTCONFORM_SPEC = register("gloo_abort_waits_for_peers", AbortWaitsForPeers)
