"""Contract: RRef details where torch's TensorPipe agent is the measure (torch 2.13).

A function that receives a user RRef forked by another user runs only after
the owner confirmed that fork: ``confirmed_by_owner()`` is True inside it,
also while the owner still builds the value. ``rref.remote().missing()``
raises AttributeError at the call, as ``rpc_sync()``/``rpc_async()`` proxies
do when they run (torch looks the method up on the owner's value type first).
"""


from fixtures import rpc_lifecycle as lifecycle
from suites.rpc import udfs
from suites.rpc.common import outcome_of, peer_name

CREATION_S = 0.3  # the owner is still building the value when the RRef is forked on


# ---------------------------------------------------------------- rank side
def forked_user_rref_confirmed_inside_callee():
    rpc = lifecycle.rpc()
    rref = rpc.remote(peer_name(1), udfs.sleep_then, args=(CREATION_S, 1))
    # peer 2: a third worker (at world size 2, this worker itself in a call to self)
    inside = outcome_of(rpc.rpc_sync, peer_name(2), udfs.rref_confirmed_here, args=(rref,))
    rref.to_here()
    return inside


def remote_proxy_of_missing_method():
    rpc = lifecycle.rpc()
    counter = rpc.remote(peer_name(), udfs.Counter, args=(0,))
    counter.to_here()
    # what the call returned, by type name (an RRef cannot travel back to pytest)
    return outcome_of(lambda: type(counter.remote().missing_method()).__name__)


# ---------------------------------------------------------------- clauses
def test_forked_user_rref_is_confirmed_inside_the_callee(rpc_agent):
    """A function receiving a user RRef forked by another user sees confirmed_by_owner() True (the owner confirmed first)."""
    for rank, got in enumerate(rpc_agent.run(forked_user_rref_confirmed_inside_callee)):
        assert not got.raised and got.value == (True, False), f"rank {rank}: inside the callee {got.describe()}"


def test_remote_proxy_of_a_missing_method_raises_at_the_call(rpc_agent):
    """rref.remote().missing_method() raises AttributeError at the call (the owner's value type is checked first)."""
    for rank, got in enumerate(rpc_agent.run(remote_proxy_of_missing_method)):
        assert got.error_type == "AttributeError" and "missing_method" in got.error, \
            f"rank {rank}: rref.remote().missing_method() {got.describe()}"
