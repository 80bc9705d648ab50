"""Seeded bug: ``rref.remote().method()`` sends the call without checking the owner's value type first.

A missing method then gives an RRef whose creation fails later on the owner
instead of raising AttributeError at the call (the reference agent before it
asked for the type, as torch's rref_proxy does). Caught by the remote-proxy
clause of suites/rpc/test_fidelity_more.py.
"""

from backends.reference.rpc import rref
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _no_check(original):
    def check_method(rref_type, func_name):
        return None  # BUG: any name passes; the owner fails the creation later
    return check_method


DISTCONFORM_SPEC = plant_in("rref_remote_proxy_unchecked", rref, "_check_method", _no_check, RpcBugHost)
