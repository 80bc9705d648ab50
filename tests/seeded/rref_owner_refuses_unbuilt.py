"""Seeded bug: an RRef's owner answers local_value() only once remote() has built the value, and refuses before.

The owner looks the value up and, finding its creation still running, raises
instead of waiting (a plausible shortcut: "no value yet" read as "no value").
Only an RRef that reaches its owner before the value exists sees it; every
other RRef clause passes. Caught by the clause where remote() takes 0.3 s and
the caller sends the RRef straight back to its owner.
"""

from backends.reference.rpc.owners import OwnerTable
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _refuse_unbuilt(original):
    def local_value(self, rref_id):
        with self.lock:
            entry = self.owned.get(rref_id)
        if entry is not None and not entry.value.done():  # BUG: a value still being built is not waited for
            raise RuntimeError(f"RRef {rref_id} has no value on its owner {self.agent.info}")
        return original(self, rref_id)
    return local_value


DISTCONFORM_SPEC = plant_in("rref_owner_refuses_unbuilt", OwnerTable, "local_value", _refuse_unbuilt, RpcBugHost)
