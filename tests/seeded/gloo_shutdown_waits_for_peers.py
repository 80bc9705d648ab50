"""Seeded bug: shutdown() first waits for the peers to agree, so destroy_process_group never returns in a partition.

destroy_process_group(group) calls the group's shutdown(); the wrapper's runs a barrier on the group and tries
again until one succeeds before shutting gloo down; while a host is cut off, or once gloo has closed the pairs,
none does. Caught by the fault clause that bounds destroy_process_group during a fault
(suites/faults/test_network_faults.py).
"""

import time

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ShutdownWaitsForPeers(GlooWrapper):
    """shutdown: a barrier with the peers first, retried until it succeeds."""

    def shutdown(self):
        while True:
            try:
                self.inner.barrier().wait()
                break
            except RuntimeError:
                time.sleep(0.05)
        return self.inner.shutdown()


DISTCONFORM_SPEC = register("gloo_shutdown_waits_for_peers", ShutdownWaitsForPeers)
