"""Contract: remote() returns an RRef to a value owned by the callee.

``to_here`` fetches the value; ``owner``/``owner_name`` name the callee and
``is_owner`` is false on the caller; on the owner the same RRef is its own
(``is_owner``, ``local_value``), also when it arrives before ``remote()`` has
finished building the value (the owner waits for the value, and can pass the
RRef on in a call to itself). Methods called through the proxies
``rpc_sync()``, ``rpc_async()`` and ``remote()`` run on the owner's one
object, so their effects add up. An RRef passed to a third worker fetches the
same value from the owner. A local ``RRef(value)`` is owned by its creator
and another worker can fetch it.
"""

import pytest
import torch

from backends.rpc_agents import worker_name
from fixtures.rank import ctx
from fixtures import rpc_lifecycle as lifecycle
from suites.rpc import udfs
from suites.rpc.common import outcome_of, peer_name

START = 5
CREATION_S = 0.3  # how long the owner takes to build a value (a slow remote() function)
CALL_TIMEOUT_S = 3.0


# ---------------------------------------------------------------- rank side
def remote_value_and_owner():
    rpc = lifecycle.rpc()
    rref = rpc.remote(peer_name(), udfs.make_tensor, args=(3, ctx.rank))
    return rref.to_here(), rref.owner().name, rref.owner_name(), rref.is_owner()


def drive_counter_through_proxies():
    rpc = lifecycle.rpc()
    counter = rpc.remote(peer_name(), udfs.Counter, args=(START,))
    after_sync = counter.rpc_sync().add(ctx.rank + 1)
    after_async = counter.rpc_async().add(10).wait()
    value_rref = counter.remote().value()
    where = counter.rpc_sync().where()
    return after_sync, after_async, value_rref.to_here(), where


def owner_sees_its_rref():
    rpc = lifecycle.rpc()
    counter = rpc.remote(peer_name(), udfs.Counter, args=(ctx.rank,))
    return rpc.rpc_sync(peer_name(), udfs.rref_seen_by_owner, args=(counter,))


def rref_back_to_owner_while_created():
    rpc = lifecycle.rpc()
    rref = rpc.remote(peer_name(), udfs.sleep_then, args=(CREATION_S, ctx.rank))
    # sent while the owner still runs the creation: the RRef arrives before its value exists
    return outcome_of(rpc.rpc_sync, peer_name(), udfs.rref_value_via_self, args=(rref, CALL_TIMEOUT_S),
                      timeout=2 * CALL_TIMEOUT_S)


def third_worker_fetches():
    rpc = lifecycle.rpc()
    counter = rpc.remote(peer_name(1), udfs.Counter, args=(100 + ctx.rank,))
    return rpc.rpc_sync(peer_name(2), udfs.rref_fetch, args=(counter,))


def local_rref_fetched_by_peer():
    rpc = lifecycle.rpc()
    mine = rpc.RRef(udfs.Counter(1000 + ctx.rank))
    fetched = rpc.rpc_sync(peer_name(), udfs.rref_fetch, args=(mine,))
    return mine.is_owner(), mine.owner().name, mine.local_value().value(), fetched


# ---------------------------------------------------------------- clauses
def test_remote_to_here_and_owner(rpc_agent):
    """remote() gives an RRef whose to_here() is the value, owned by the callee (owner, owner_name), not by the caller."""
    n = rpc_agent.world_size
    for rank, (value, owner, owner_name, is_owner) in enumerate(rpc_agent.run(remote_value_and_owner)):
        assert torch.equal(value, torch.full((3,), float(rank))), f"rank {rank}: to_here() gave {value}"
        want = worker_name((rank + 1) % n)
        assert (owner, owner_name, is_owner) == (want, want, False), \
            f"rank {rank}: owner {owner}, owner_name {owner_name}, is_owner {is_owner}; expected {want}, not owner"


def test_method_calls_through_proxies_share_one_object(rpc_agent):
    """rref.rpc_sync()/rpc_async()/remote() method calls run on the owner's single object: their effects add up."""
    n = rpc_agent.world_size
    for rank, (after_sync, after_async, value, where) in enumerate(rpc_agent.run(drive_counter_through_proxies)):
        assert (after_sync, after_async, value) == (START + rank + 1, START + rank + 11, START + rank + 11), \
            f"rank {rank}: counter went {after_sync}, {after_async}, {value}"
        assert where == worker_name((rank + 1) % n), f"rank {rank}: the object was built on {where}"


def test_owner_sees_its_own_rref(rpc_agent):
    """An RRef sent back to its owner is the owner's: is_owner() and local_value() there."""
    for rank, (is_owner, value) in enumerate(rpc_agent.run(owner_sees_its_rref)):
        assert (is_owner, value) == (True, rank), f"rank {rank}: on the owner is_owner={is_owner}, value={value}"


@pytest.mark.needs(rpc_feature="rref_to_owner_before_created")
def test_rref_reaches_owner_before_its_value(rpc_agent):
    """An RRef sent to its owner while remote() still builds the value works there, even in a call to self."""
    for rank, got in enumerate(rpc_agent.run(rref_back_to_owner_while_created)):
        assert not got.raised, f"rank {rank}: {got.error_type}: {got.error.splitlines()[0]}"
        assert got.value == rank + 1, f"rank {rank}: the owner read {got.value}, expected {rank + 1}"


@pytest.mark.min_world_size(3)
def test_rref_passed_to_third_worker(rpc_agent):
    """An RRef passed to a third worker fetches the owner's value there; the third worker is not the owner."""
    n = rpc_agent.world_size
    for rank, got in enumerate(rpc_agent.run(third_worker_fetches)):
        assert got == (100 + rank, worker_name((rank + 1) % n), False), f"rank {rank}: third worker saw {got}"


def test_local_rref_is_owned_by_creator(rpc_agent):
    """RRef(value) is owned by its creator (is_owner, local_value) and a peer fetches the value from it."""
    for rank, (is_owner, owner, local, fetched) in enumerate(rpc_agent.run(local_rref_fetched_by_peer)):
        assert (is_owner, owner, local) == (True, worker_name(rank), 1000 + rank), \
            f"rank {rank}: is_owner {is_owner}, owner {owner}, local value {local}"
        assert fetched == (1000 + rank, worker_name(rank), False), f"rank {rank}: the peer fetched {fetched}"
