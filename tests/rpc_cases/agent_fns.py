"""Rank side of tests/test_reference_rpc.py: the reference RPC agent in live worlds.

Every function starts its own agent on the case's private store (``ctx.store``:
the same prefix on every rank of one run) and shuts it down before returning,
so a world can run any number of them, in any order.
"""

from __future__ import annotations

import socket
import struct
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

import backends.reference.rpc as rpc
from backends.reference.rpc import tp_codec
from fixtures.rank import ctx
from suites.rpc.common import barrier


# ------------------------------------------------------------- callees
def add(a, b):
    return a + b


def zero():
    return 0


def whoami():
    return rpc.get_worker_info().name


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def boom(text):
    raise ValueError(text)


class Counter:
    def __init__(self, start):
        self.value = start

    def add(self, step):
        self.value += step
        return self.value


@rpc.functions.async_execution
def async_twice(to, x):
    return rpc.rpc_async(to, add, args=(x, x)).then(lambda fut: fut.value() * 2)


@torch.jit.script
def script_mul(x: torch.Tensor, k: int) -> torch.Tensor:
    return x * k


def rref_sum(rref):
    """Called with a user RRef as argument: fetches its value from the owner."""
    return rref.to_here().sum()


# ------------------------------------------------------------- helpers
def name(rank: int) -> str:
    return f"worker{rank}"


def options(agent: str = "reference-tp", prefix: str = "a", **kwargs):
    store = dist.PrefixStore(prefix, ctx.store)
    return rpc.ReferenceRpcBackendOptions(agent=agent, store=store, rpc_timeout=kwargs.pop("rpc_timeout", 20.0),
                                          **kwargs)


def start(agent: str = "reference-tp", prefix: str = "a", **kwargs) -> None:
    rpc.init_rpc(name(ctx.rank), rank=ctx.rank, world_size=ctx.world_size,
                 rpc_backend_options=options(agent, prefix, **kwargs))


@contextmanager
def running(agent: str = "reference-tp", prefix: str = "a", **kwargs):
    start(agent, prefix, **kwargs)
    try:
        yield rpc
    finally:
        rpc.shutdown()


def error_of(call, *args, **kwargs):
    """(type name, text, seconds) of what ``call`` raised, or (None, value, seconds)."""
    begin = time.perf_counter()
    try:
        value = call(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__, str(exc), time.perf_counter() - begin
    return None, value, time.perf_counter() - begin


def peer() -> int:
    return (ctx.rank + 1) % ctx.world_size


# ------------------------------------------------------------- cases
def basics(agent: str) -> dict:
    """Every kind of call to the next rank and to self."""
    with running(agent):
        to = peer()
        out = {
            "sync_python": rpc.rpc_sync(name(to), add, args=(torch.ones(2), ctx.rank)),
            "sync_by_rank": rpc.rpc_sync(to, whoami),
            "sync_by_info": rpc.rpc_sync(rpc.get_worker_info(name(to)), whoami),
            "builtin": rpc.rpc_sync(to, torch.add, args=(torch.ones(2), 1)),
            "script": rpc.rpc_sync(to, script_mul, args=(torch.ones(2), 3)),
            "self": rpc.rpc_sync(ctx.rank, whoami),
            "kwargs": rpc.rpc_sync(to, add, kwargs={"a": 1, "b": 2}),
            "async": rpc.rpc_async(to, add, args=(1, ctx.rank)).then(lambda f: f.value() * 10).wait(),
            "async_execution": rpc.rpc_sync(to, async_twice, args=(name(ctx.rank), 5)),
            "tensor_layouts": rpc.rpc_sync(to, add, args=(torch.arange(6.).reshape(2, 3).t(), 0)),
            "many": torch.futures.wait_all([rpc.rpc_async(to, add, args=(i, 0)) for i in range(50)]),
        }
        rref = rpc.remote(to, Counter, args=(ctx.rank,))
        out["remote_owner"] = (rref.owner_name(), rref.is_owner())
        out["proxy_sync"] = rref.rpc_sync().add(1)
        out["proxy_async"] = rref.rpc_async().add(1).wait()
        out["proxy_remote"] = rref.remote().add(1).to_here()
        out["confirmed"] = rref.confirmed_by_owner()
        tensor_rref = rpc.remote(to, torch.ones, args=((3,),))
        out["rref_as_arg"] = rpc.rpc_sync((ctx.rank + 2) % ctx.world_size, rref_sum, args=(tensor_rref,))
        local = rpc.RRef(torch.full((2,), 7.0))
        out["local_rref"] = (local.is_owner(), rpc.rpc_sync(to, rref_sum, args=(local,)))
        out["remote_error"] = error_of(lambda: rpc.remote(to, boom, args=("in remote",)).to_here())[:2]
        out["udf_error"] = error_of(rpc.rpc_sync, to, boom, args=("marker-17",))[:2]
        return out


def init_shutdown_cycles(agents: list) -> list:
    """init -> call -> shutdown, again and again in the same process (the suite reuses processes)."""
    results = []
    for i, agent in enumerate(agents):
        with running(agent, prefix=f"cycle{i}"):
            results.append((agent, rpc.rpc_sync(peer(), whoami), rpc.get_worker_info().id))
    return results


def not_initialized() -> list:
    """Calls before init and after shutdown raise torch's RuntimeError."""
    before = error_of(rpc.rpc_sync, 0, zero)[:2]
    with running():
        during = rpc.rpc_sync(peer(), zero)
        again = error_of(start, prefix="twice")[:2]
    after = [error_of(rpc.rpc_sync, 0, zero)[:2], error_of(rpc.rpc_async, 0, zero)[:2],
             error_of(rpc.remote, 0, zero)[:2], error_of(rpc.get_worker_info)[:2], error_of(rpc.shutdown)[:2]]
    return [before, during, again, after]


def addressing_errors() -> list:
    with running():
        return [error_of(rpc.rpc_sync, 1.5, zero)[:2], error_of(rpc.rpc_sync, ctx.world_size, zero)[:2],
                error_of(rpc.rpc_sync, -1, zero)[:2], error_of(rpc.rpc_sync, "nobody", zero)[:2],
                error_of(rpc.rpc_sync, 0, 3)[:2], error_of(rpc.get_worker_info, "nobody")[:2]]


def duplicate_names() -> tuple:
    """Two workers claim one name: every worker's init_rpc says so."""
    got = error_of(rpc.init_rpc, "same" if ctx.rank < 2 else name(ctx.rank), rank=ctx.rank,
                   world_size=ctx.world_size, rpc_backend_options=options(prefix="dup"))[:2]
    try:
        rpc.shutdown(graceful=False)
    except RuntimeError:
        pass
    return got


def timeouts() -> dict:
    """Per-call timeout, default timeout, to_here timeout, a late answer dropped, timeout=0."""
    out = {}
    # started under the default timeout, then shortened as torch's own tests do (rpc._set_rpc_timeout): the agent
    # connects within its RPC timeout, and 0.3 s of connecting failed once on a loaded machine
    with running():
        rpc._set_rpc_timeout(0.3)
        to = peer()
        out["per_call"] = error_of(rpc.rpc_sync, to, sleep_then, args=(1.0, "late"), timeout=0.2)
        out["default"] = error_of(rpc.rpc_sync, to, sleep_then, args=(1.0, "late"))
        out["async"] = error_of(lambda: rpc.rpc_async(to, sleep_then, args=(1.0, "late"), timeout=0.2).wait())
        # the remote's own (creation) timeout is long: under load its default 300 ms could fire before
        # to_here's 200 ms, which start later, and to_here would then report the creation's timeout
        out["to_here"] = error_of(lambda: rpc.remote(to, sleep_then, args=(1.0, "late"), timeout=5).to_here(timeout=0.2))
        out["no_timeout"] = error_of(rpc.rpc_sync, to, sleep_then, args=(0.5, "in time"), timeout=0)
        time.sleep(1.0)  # the late answers arrive now and must be dropped
        out["after"] = rpc.rpc_sync(to, add, args=(1, 2))
        out["pending"] = len(rpc.api._current_agent()._pending)
    return out


def blocking_callee() -> dict:
    """A callee busy in a blocking function still answers other requests (up to its pool size)."""
    with running(num_worker_threads=4):
        slow = rpc.rpc_async(peer(), sleep_then, args=(1.5, "slow"))
        time.sleep(0.05)
        quick = error_of(rpc.rpc_sync, peer(), add, args=(1, 1))
        slow_value = slow.wait()
        time.sleep(0.1)
    return {"quick": quick, "slow": slow_value}


def graceful_shutdown_in_flight() -> dict:
    """shutdown() on every rank while rank 0's calls still run: they complete, then everyone stops."""
    start(prefix="g")
    futs = []
    if ctx.rank == 0:
        futs = [rpc.rpc_async(r, sleep_then, args=(0.5, r)) for r in range(1, ctx.world_size)]
    begin = time.perf_counter()
    rpc.shutdown()
    took = time.perf_counter() - begin
    return {"values": [f.wait() for f in futs], "took": took}


def ungraceful_shutdown_fails_pending() -> dict:
    """shutdown(graceful=False) with a call outstanding fails its future instead of waiting."""
    start(prefix="u")
    out = {}
    if ctx.rank == 0:
        fut = rpc.rpc_async(1, sleep_then, args=(1.0, "never seen"))
        time.sleep(0.05)
        rpc.shutdown(graceful=False)
        out["pending"] = error_of(fut.wait)[:2]
    else:
        time.sleep(1.5)  # let the call finish (its answer goes nowhere), then leave
        rpc.shutdown(graceful=False)
    return out


def stranger_refused() -> dict:
    """A connection without the world's token is refused with the reason; the agent keeps serving."""
    with running(prefix="s"):
        # every worker's peers are connected before anyone claims a rank: a claim that came first
        # would be adopted in place of the real dialer (claimed_before_connect shows what follows)
        barrier("s-started")
        agent = rpc.api._current_agent()
        target = peer()
        host, port = agent.store.get(f"tp/addr/{target}").decode().rsplit(":", 1)
        replies = []
        for hello in ({"token": "not-the-token", "rank": ctx.rank}, {"rank": 1}, None):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                if hello is None:
                    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                else:
                    sock.sendall(tp_codec.hello_bytes(tp_codec.HELLO, hello))
                kind, body = tp_codec.read_control(sock)
                replies.append((kind, body.get("reason")))
        # a real peer's rank claimed with the right token: refused too (it is connected)
        token = agent.store.get("tp/token").decode()
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            claimed = ctx.world_size - 1  # connected already, or not a rank that dials the target
            sock.sendall(tp_codec.hello_bytes(tp_codec.HELLO, {"token": token, "rank": claimed}))
            kind, body = tp_codec.read_control(sock)
            replies.append((kind, body.get("reason")))
        still = rpc.rpc_sync(target, add, args=(torch.ones(2), 1))
        time.sleep(0.1)
        refused = list(agent.transport.refused)
    return {"replies": replies, "still": still, "refused": refused}


def claimed_before_connect() -> dict:
    """World size 3: rank 0 claims rank 2 at rank 1 (with the world's token) before rank 2 dials it.

    Rank 1 adopts the impostor, refuses the real rank 2, and sends it a call that
    lands, unread, on rank 0's socket; rank 0 then resets that socket. The call
    fails and both ends of the 1-2 link lose it; graceful shutdown must still
    return on every worker (the lost call is not in flight any more).
    """
    from backends.reference import handshake
    from backends.reference.rpc.tp_transport import TpTransport

    store = dist.PrefixStore("cb-case", ctx.store)
    real_dial, real_adopt = handshake.dial, TpTransport._adopt

    def dial_after_the_impostor(store_, prefix, peer, hello, timeout_s):
        if peer == 1:
            store.wait(["adopted"])
        return real_dial(store_, prefix, peer, hello, timeout_s)

    def adopt_and_tell(self, peer, sock):
        real_adopt(self, peer, sock)
        if peer == 2:
            store.set("adopted", "1")

    if ctx.rank == 1:
        TpTransport._adopt = adopt_and_tell
    if ctx.rank == 2:
        handshake.dial = dial_after_the_impostor
    out: dict = {}
    try:
        start(prefix="cb")
        agent = rpc.api._current_agent()
        if ctx.rank == 0:
            host, port = agent.store.get("tp/addr/1").decode().rsplit(":", 1)
            token = agent.store.get("tp/token").decode()
            impostor = socket.create_connection((host, int(port)), timeout=5)
            impostor.sendall(tp_codec.hello_bytes(tp_codec.HELLO, {"token": token, "rank": 2}))
            store.wait(["sent", "refused"])  # held open until the real rank 2 was refused
            impostor.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            impostor.close()  # a reset: rank 1's call is still unread in it
        if ctx.rank == 1:
            fut = rpc.rpc_async(2, add, args=(1, 1))
            store.set("sent", "1")
            out["call"] = error_of(fut.wait)[:2]
        if ctx.rank == 2:
            while not agent.transport.dropped:  # rank 1's REFUSED arrived on the link rank 2 dialed
                time.sleep(0.002)
            store.set("refused", "1")
        begin = time.perf_counter()
        rpc.shutdown()
        out["shutdown_s"] = time.perf_counter() - begin
        out["refused"] = list(agent.transport.refused)
    finally:
        handshake.dial, TpTransport._adopt = real_dial, real_adopt
    return out


def profiled_call() -> list:
    """Under the legacy profiler, an RPC's record and the callee's ops (renamed #remote_op:) are in the profile."""
    with running(prefix="prof"):
        with torch.autograd.profiler_legacy.profile() as prof:  # torch profiles RPCs under the legacy profiler only
            rpc.rpc_sync(peer(), torch.add, args=(torch.ones(2), 1))
            rpc.rpc_async(peer(), add, args=(torch.ones(2), torch.ones(2))).wait()
        return sorted({event.name for event in prof.function_events if "rpc_" in event.name})


def owned_count():
    import gc

    gc.collect()
    return rpc.api._current_agent().rrefs.owned_count()


def rref_lifetimes() -> dict:
    """RRefs made, forked to other workers and dropped are freed on their owner; one still held is kept."""
    import gc

    with running(prefix="life"):
        to, third = peer(), (ctx.rank + 2) % ctx.world_size
        kept = rpc.remote(to, torch.full, args=((2,), float(ctx.rank)))
        dropped = [rpc.remote(to, torch.ones, args=((3,),)) for _ in range(5)]
        sums = [rpc.rpc_sync(third, rref_sum, args=(r,)) for r in dropped]  # a fork on a third worker
        local = rpc.RRef(torch.ones(4))
        sums.append(rpc.rpc_sync(to, rref_sum, args=(local,)))
        proxy = rpc.remote(to, Counter, args=(0,))
        sums.append(proxy.rpc_sync().add(5))
        del dropped, local, proxy
        gc.collect()
        barrier("life-dropped")
        time.sleep(0.3)  # deletes are flushed every 20 ms
        counts = [rpc.rpc_sync(r, owned_count) for r in range(ctx.world_size)]
        barrier("life-counted")
        return {"sums": sums, "counts": counts, "kept": kept.to_here()}
