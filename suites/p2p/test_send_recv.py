"""Contract: point-to-point send/recv on the default group.

A tensor sent by rank s to rank d arrives at d unchanged (dtype, shape,
every bit), whether sent with blocking send/recv or with isend/irecv and
wait(); a recv naming a source takes only that source's message and
returns it as the sender; tags select which message a recv gets,
whatever order the recvs are posted in; messages between one pair with one
tag arrive in the order they were sent; a recv without a source takes a
message from any rank and reports who sent it; isend returns before the
receiver posts its recv, however large the message (only wait() waits). Every payload says which
rank made it (suites.values.rank_payload), so a message delivered to the
wrong rank, from the wrong rank or out of order is caught.
"""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import values
from suites.checks import expect_tensor
from suites.p2p.common import decoy, neighbours, payload, sent

pytestmark = [pytest.mark.needs(collective="send_recv"), pytest.mark.min_world_size(2)]

RING_SALT, ASYNC_SALT, ORDER_SALT, TAG_SALT, ANY_SALT, LARGE_SALT, SRC_SALT, EARLY_SALT = 11, 22, 33, 44, 55, 66, 77, 88
IN_FLIGHT = 4  # messages one rank has outstanding to its neighbour in the ordering clause
DTYPE_NUMEL = 64
DRAIN_S = 2.0  # how long rank 0 waits for each message it still owes a sender after an error
# how long the receiver waits for the sender's word that its isend returned before it posts its recv anyway (so a
# backend whose isend waits for the receiver is caught, not hung): a returning isend takes milliseconds
ISEND_RETURN_WAIT = timedelta(seconds=10)


# ---------------------------------------------------------------- rank side
def ring_blocking(shape_name, salt, dtype="float32"):
    """Blocking ring: send to next, recv from previous.

    Even ranks send first, odd ranks receive first. Even with rendezvous
    semantics (send returns only once the peer has received) this cannot
    deadlock for any size: every odd rank's first recv matches its even
    predecessor's first send; with n odd, rank n-1 (even) sends to rank 0,
    whose recv follows its own completed send to rank 1.
    """
    nxt, prv = neighbours(ctx.rank, ctx.world_size)
    outgoing = sent(shape_name, dtype, salt)
    incoming = decoy(payload(prv, shape_name, dtype, salt))
    if ctx.rank % 2 == 0:
        dist.send(outgoing, nxt)
        source = dist.recv(incoming, prv)
    else:
        source = dist.recv(incoming, prv)
        dist.send(outgoing, nxt)
    return source, incoming.cpu()


def ring_async(salt):
    nxt, prv = neighbours(ctx.rank, ctx.world_size)
    incoming = decoy(payload(prv, salt=salt))
    recv_work = dist.irecv(incoming, prv)
    send_work = dist.isend(sent(salt=salt), nxt)
    assert recv_work is not None and send_work is not None, "isend/irecv returned None for a member rank"
    send_work.wait()
    recv_work.wait()
    return incoming.cpu(), send_work.is_completed(), recv_work.is_completed()


def ring_in_order(salt, count):
    """IN_FLIGHT messages with one tag to the next rank, all outstanding at once."""
    nxt, prv = neighbours(ctx.rank, ctx.world_size)
    incoming = [decoy(payload(prv, salt=salt + 100 * i)) for i in range(count)]
    recvs = [dist.irecv(t, prv) for t in incoming]
    sends = [dist.isend(sent(salt=salt + 100 * i), nxt) for i in range(count)]
    for work in sends + recvs:
        work.wait()
    return [t.cpu() for t in incoming]


def tagged_out_of_order(salt):
    """Rank 0 sends tag 1 then tag 2; rank 1 posts and waits for tag 2 first."""
    if ctx.rank == 0:
        first = dist.isend(sent(salt=salt + 1), 1, tag=1)
        second = dist.isend(sent(salt=salt + 2), 1, tag=2)
        first.wait()
        second.wait()
        return None
    if ctx.rank == 1:
        got_tag2 = decoy(payload(0, salt=salt + 2))
        got_tag1 = decoy(payload(0, salt=salt + 1))
        work2 = dist.irecv(got_tag2, 0, tag=2)
        work1 = dist.irecv(got_tag1, 0, tag=1)
        work2.wait()
        work1.wait()
        return got_tag1.cpu(), got_tag2.cpu()
    return None


def recv_by_source(salt):
    """Rank 0 posts irecv(src=2) before irecv(src=1); rank 1 sends first, rank 2 only after.

    Rank 2 waits (on the case's store) until rank 1's send has completed, so
    rank 1's message reaches rank 0 first and meets the recv posted for rank 2
    first: a backend that matches on arrival instead of on the source hands it
    to the wrong recv. A correct backend has no ordering to get wrong.
    """
    if ctx.rank == 0:
        from_2 = decoy(payload(2, salt=salt))
        from_1 = decoy(payload(1, salt=salt))
        work_2 = dist.irecv(from_2, 2)
        work_1 = dist.irecv(from_1, 1)
        work_1.wait()
        work_2.wait()
        return from_1.cpu(), from_2.cpu()
    if ctx.rank == 1:
        dist.send(sent(salt=salt), 0)
        ctx.store.set("rank1_sent", "1")
    elif ctx.rank == 2:
        ctx.store.wait(["rank1_sent"], timedelta(seconds=30))
        dist.send(sent(salt=salt), 0)
    return None


def gather_from_any_source(salt, shape_name="1d"):
    """Rank 0 receives one message from every other rank with recv(src=None).

    If such a recv raises, rank 0 still tries to take the messages it has not
    got by named source, each with a bounded wait (the failed recv may or may
    not have consumed one), so the senders can finish and the error comes back
    as a value instead of a hang. Every rank returns (value, error).
    """
    if ctx.rank != 0:
        try:
            dist.send(sent(shape_name, salt=salt), 0)
        except Exception as exc:
            return None, f"{type(exc).__name__}: {str(exc).strip()}"
        return None, None
    received, error = [], None
    for _ in range(ctx.world_size - 1):
        buffer = torch.full(values.SHAPES[shape_name], -1.0, device=ctx.device)
        try:
            source = dist.recv(buffer)  # src=None: any source
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc).strip()}"
            break
        received.append((source, buffer.cpu()))
    if error is not None:
        done = {source for source, _ in received}
        for source in range(1, ctx.world_size):
            if source not in done:
                try:
                    work = dist.irecv(torch.empty(values.SHAPES[shape_name], device=ctx.device), source)
                    work.wait(timeout=timedelta(seconds=DRAIN_S))
                except Exception:
                    break  # that message is gone or the group is broken: the test resets the world
    return received, error


def isend_before_the_recv(salt):
    """Rank 0 isends 32 MiB to rank 1 and says so in the store once isend returned; rank 1 posts its recv only after
    that word (or after ISEND_RETURN_WAIT without it). Returns (rank 1: whether the word came first, the message)."""
    key = f"isend-returned/{salt}"
    if ctx.rank == 0:
        work = dist.isend(sent("32MiB", salt=salt), 1)
        ctx.store.set(key, "1")
        work.wait()
        return None
    if ctx.rank != 1:
        return None
    try:
        ctx.store.wait([key], ISEND_RETURN_WAIT)
        came_first = True
    except Exception:  # DistStoreError: the word never came; post the recv so the sender is let go
        came_first = False
    incoming = decoy(payload(0, "32MiB", salt=salt))
    dist.recv(incoming, 0)
    return came_first, incoming.cpu()


def dtype_payload(rank, dtype):
    """rank_payload made hard for dtype: bits a narrower transport would lose."""
    if dtype == "int64":  # 2**55 + r*1000 + k: not representable in float64
        return values.rank_payload(rank, DTYPE_NUMEL, "int64", salt=2**55)
    if dtype == "int32":  # 2**30 + ...: not representable in float32
        return values.rank_payload(rank, DTYPE_NUMEL, "int32", salt=2**30)
    if dtype == "float64":  # a 2**-40 step: lost in float32
        return values.rank_payload(rank, DTYPE_NUMEL, "float64") + (rank + 1) * 2.0**-40
    if dtype == "bool":  # a pattern that differs per rank (rank_payload is almost all True)
        return values.rank_payload(rank, DTYPE_NUMEL, "int64") % (rank + 2) == 0
    return values.rank_payload(rank, DTYPE_NUMEL, dtype)


def pair_exchange_dtype(dtype):
    """Ranks 0 and 1 swap dtype_payload tensors (0 sends first); the rest idle."""
    if ctx.rank > 1:
        return None
    peer = 1 - ctx.rank
    outgoing = dtype_payload(ctx.rank, dtype).to(ctx.device)
    incoming = decoy(dtype_payload(peer, dtype))
    if ctx.rank == 0:
        dist.send(outgoing, peer)
        dist.recv(incoming, peer)
    else:
        dist.recv(incoming, peer)
        dist.send(outgoing, peer)
    return incoming.cpu()


# ------------------------------------------------------------------ clauses
def check_ring(results, n, shape_name, salt, what, dtype="float32"):
    for rank, (source, incoming) in enumerate(results):
        _, prv = neighbours(rank, n)
        assert source == prv, f"{what}: recv on rank {rank} reported sender {source}, expected {prv}"
        expect_tensor(incoming, payload(prv, shape_name, dtype, salt), f"{what}: rank {rank} from rank {prv}")


@pytest.mark.parametrize("shape", ["1d", "2d", "scalar", "empty"])
def test_send_recv_ring(world, shape):
    """Blocking send/recv around a ring delivers each rank's tensor to the next rank, exactly."""
    results = world.run(ring_blocking, shape, RING_SALT)
    check_ring(results, world.world_size, shape, RING_SALT, f"blocking ring ({shape})")


def test_send_recv_large_message(world):
    """A 4 MiB float32 message arrives exactly (blocking ring)."""
    results = world.run(ring_blocking, "4MiB", LARGE_SALT)
    check_ring(results, world.world_size, "4MiB", LARGE_SALT, "4 MiB ring")


def test_isend_returns_before_the_receiver_posts_its_recv(world):
    """isend of 32 MiB returns before the receiver has posted its recv; the message then arrives exactly."""
    came_first, incoming = world.run(isend_before_the_recv, EARLY_SALT)[1]
    assert came_first, (f"rank 0's isend of 32 MiB did not return until rank 1 posted its recv (rank 1 waited "
                        f"{ISEND_RETURN_WAIT.total_seconds():g} s for it): isend waited for the receiver")
    expect_tensor(incoming, payload(0, "32MiB", salt=EARLY_SALT), "the 32 MiB message on rank 1")


@pytest.mark.needs(clause="test_isend_irecv_ring")
def test_isend_irecv_ring(world):
    """isend/irecv return Works; after wait() the data has arrived and is_completed() is True."""
    results = world.run(ring_async, ASYNC_SALT)
    n = world.world_size
    for rank, (incoming, send_done, recv_done) in enumerate(results):
        _, prv = neighbours(rank, n)
        expect_tensor(incoming, payload(prv, salt=ASYNC_SALT), f"irecv on rank {rank} from rank {prv}")
        assert send_done, f"isend Work of rank {rank}: is_completed() is False after wait()"
        assert recv_done, f"irecv Work of rank {rank}: is_completed() is False after wait()"


def test_same_tag_messages_arrive_in_order(world):
    """Several messages in flight between one pair with one tag are received in the order they were sent."""
    results = world.run(ring_in_order, ORDER_SALT, IN_FLIGHT)
    n = world.world_size
    for rank, incoming in enumerate(results):
        _, prv = neighbours(rank, n)
        for i, tensor in enumerate(incoming):
            expect_tensor(tensor, payload(prv, salt=ORDER_SALT + 100 * i),
                          f"message {i} of {IN_FLIGHT} from rank {prv} to rank {rank}")


def test_tags_select_the_message(world):
    """A recv gets the message with its tag, even when recvs are posted and waited in the other order."""
    results = world.run(tagged_out_of_order, TAG_SALT)
    got_tag1, got_tag2 = results[1]
    expect_tensor(got_tag2, payload(0, salt=TAG_SALT + 2), "recv(tag=2) on rank 1 (posted first)")
    expect_tensor(got_tag1, payload(0, salt=TAG_SALT + 1), "recv(tag=1) on rank 1 (posted second)")


@pytest.mark.min_world_size(3)
def test_recv_from_named_source_only(world):
    """recv(src=s) takes s's message only, even when another rank's message arrives first."""
    from_1, from_2 = world.run(recv_by_source, SRC_SALT)[0]
    expect_tensor(from_1, payload(1, salt=SRC_SALT), "rank 0's recv(src=1) (posted second, message arrived first)")
    expect_tensor(from_2, payload(2, salt=SRC_SALT), "rank 0's recv(src=2) (posted first, message arrived second)")


@pytest.mark.needs(feature="recv_any_source")
@pytest.mark.parametrize("shape", ["1d", pytest.param("empty", marks=pytest.mark.needs(shape="empty"))])
def test_recv_any_source_reports_sender(world, shape):
    """recv without src takes every rank's message, in any order, and returns the rank that sent it."""
    results = world.run(gather_from_any_source, ANY_SALT, shape)
    received, error = results[0]
    sender_errors = {rank: err for rank, (_, err) in enumerate(results) if err is not None and rank}
    if error is not None or sender_errors:
        world.tainted = True  # a failed recv/send may have left state behind: fresh groups for the next case
    assert error is None, f"recv without src of a {shape} tensor raised on rank 0: {error}"
    assert not sender_errors, f"send to rank 0 raised: {sender_errors}"
    senders = [source for source, _ in received]
    assert sorted(senders) == list(range(1, world.world_size)), \
        f"rank 0 received from {senders}, expected each of ranks 1..{world.world_size - 1} once"
    for source, tensor in received:
        expect_tensor(tensor, payload(source, shape, salt=ANY_SALT),
                      f"{shape} message rank 0 received from reported sender {source}")


@pytest.mark.parametrize("dtype", list(values.DTYPES))
def test_send_recv_dtypes(world, dtype):
    """send/recv carries every dtype bit for bit (int64 beyond 2**53, float64 beyond float32, bool)."""
    results = world.run(pair_exchange_dtype, dtype)
    expect_tensor(results[1], dtype_payload(0, dtype), f"{dtype} from rank 0 to rank 1")
    expect_tensor(results[0], dtype_payload(1, dtype), f"{dtype} from rank 1 to rank 0")
    assert all(r is None for r in results[2:]), "idle ranks returned something"
