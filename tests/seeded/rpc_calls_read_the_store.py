"""Seeded bug: every call looks its destination up in the store again.

An agent that resolves the worker it calls through the rendezvous store on each call (its name key), instead of
the table it built when it started. Harmless while the store answers; with the store cut off from a worker's host
(the control plane alone), that worker's calls wait on a store request nobody answers (torch's TCPStore client
never gives it up), though the agents' own connections are intact. Caught by the clause that a store cut off never
breaks a call between started agents.
"""

from tests.seeded.rpc_base import plant


def _reads_the_store(original):
    def call(self, dst, *args, **kwargs):
        self.store.get(f"agent/name/{dst}")  # BUG: the store on every call's path
        return original(self, dst, *args, **kwargs)
    return call


DISTCONFORM_SPEC = plant("rpc_calls_read_the_store", "call", _reads_the_store)
