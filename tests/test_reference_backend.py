"""The reference backend (backends/reference/) tested directly, in one process.

A world is 2 or 3 ReferenceProcessGroup objects built in threads of this
process around one in-memory HashStore; ``run_on_all`` runs a function on
every rank's group in its own thread and names the rank that raised or hung.
On top of that:

* the transport is fuzzed: thousands of outsider connections with garbage,
  truncated or forged frames are all refused (and counted, with a reason),
  thousands of garbled headers / metas / tensor descriptions raise
  ProtocolError and nothing else, and a connected peer that sends a garbled
  frame is marked broken so everything waiting on it fails at once, naming it;
* disagreeing ranks, missing ranks and per-call timeouts raise on every rank
  with the operation, the ranks and the difference in the message;
* the Work API (is_completed, get_future, exception, _source_rank) behaves;
* two real processes use the backend through plain torch.distributed.

An autouse fixture fails any test during which a backend thread (named
``reference-*``) died of an exception.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import backends.reference  # noqa: F401  registers "reference"
from backends.reference import process_group, transport, wire
from backends.reference.process_group import CollectiveMismatch, ReferenceProcessGroup

try:
    from torch.distributed import AllgatherOptions
except ImportError:  # not re-exported by every torch
    from torch._C._distributed_c10d import AllgatherOptions

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = timedelta(seconds=20)  # group timeout when a test is not about timeouts
HANG_S = 10.0  # a rank still running after this in run_on_all is hung

# How much the fuzz tests send. Hypothesis explores structured inputs (and shrinks a failure to
# a small example) but costs a few ms per example here; seeded random mutation loops add volume.
OUTSIDER_EXAMPLES = 400  # hypothesis: outsider connections
OUTSIDER_MUTANTS = 2000  # seeded loop: outsider connections with mutated frames
WIRE_EXAMPLES = 300  # hypothesis: inputs per wire function (decode_header, decode_meta, tensor_from)
WIRE_MUTANTS = 10_000  # seeded loop: inputs per wire function
SEED = 20240611


# ====================================================================== harness
def run_each(items, fn, timeout: float = HANG_S) -> list:
    """fn(item) for every item, each in its own thread; per item its result or the exception it raised.

    A thread still running after ``timeout`` seconds fails the test, naming its rank.
    """
    items = list(items)
    outcomes: list = [None] * len(items)

    def body(index, item):
        try:
            outcomes[index] = fn(item)
        except BaseException as exc:  # noqa: BLE001 - reported per rank
            outcomes[index] = exc

    threads = [threading.Thread(target=body, args=(i, item), daemon=True, name=f"test-rank-{i}")
               for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, thread in enumerate(threads) if thread.is_alive()]
    if hung:
        raise AssertionError(f"ranks {hung} were still running after {timeout:g} s: hung")
    return outcomes


def run_on_all(items, fn, timeout: float = HANG_S) -> list:
    """fn(item) for every item (a rank's group, or a rank number) in threads; the results in rank order.

    Raises AssertionError naming every rank that raised (chained to the first error) or hung.
    """
    outcomes = run_each(items, fn, timeout)
    failed = [(rank, exc) for rank, exc in enumerate(outcomes) if isinstance(exc, BaseException)]
    if failed:
        raise AssertionError("; ".join(f"rank {rank} raised {type(exc).__name__}: {exc}" for rank, exc in failed)) \
            from failed[0][1]
    return outcomes


def make_world(n: int, timeout: timedelta = LONG, host: str | None = None,
               global_ranks: list[int] | None = None) -> list[ReferenceProcessGroup]:
    """n ReferenceProcessGroups of one world, built concurrently (they rendezvous through one HashStore)."""
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=HANG_S))
    return run_on_all(range(n), lambda rank: ReferenceProcessGroup(store, rank, n, timeout, global_ranks=global_ranks,
                                                                   host=host))


@pytest.fixture
def ref_world():
    """make_world, with every group built by the test shut down afterwards."""
    made: list[ReferenceProcessGroup] = []

    def make(n: int, timeout: timedelta = LONG, host: str | None = None, global_ranks: list[int] | None = None):
        pgs = make_world(n, timeout, host, global_ranks)
        made.extend(pgs)
        return pgs

    yield make
    for pg in made:
        pg.shutdown()


@pytest.fixture(autouse=True)
def backend_threads_never_die(monkeypatch):
    """Fail the test if any thread of the backend ('reference-*') ended with an exception meanwhile."""
    died: list[str] = []
    previous = threading.excepthook

    def hook(args):
        if args.thread is not None and args.thread.name.startswith("reference-"):
            died.append(f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
        previous(args)

    monkeypatch.setattr(threading, "excepthook", hook)
    yield
    assert not died, f"backend threads died of an exception (the process would lose them silently): {died}"


def all_reduce(pg, tensor, op=dist.ReduceOp.SUM, timeout: timedelta | None = None):
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    if timeout is not None:
        opts.timeout = timeout
    return pg.allreduce([tensor], opts)


def broadcast(pg, tensor, root):
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return pg.broadcast([tensor], opts)


def all_reduce_value(pg, value: float = 0.0, op=dist.ReduceOp.SUM):
    """Blocking all_reduce of [rank + 1 + value, 10 * (rank + 1)]; the result as a list."""
    rank = pg.rank()
    t = torch.tensor([rank + 1 + value, 10.0 * (rank + 1)])
    all_reduce(pg, t, op).wait()
    return t.tolist()


def expected_sum(n: int, value: float = 0.0):
    return [sum(r + 1 + value for r in range(n)), sum(10.0 * (r + 1) for r in range(n))]


def backend_threads(pg) -> dict[str, list]:
    """The live threads of one group: its worker, its mesh's accept loop (its listener's) and reader loops (peer
    numbers)."""
    found = {"worker": [], "accept": [], "read": [], "handshake": []}
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)  # CPython keeps it while the thread runs
        if getattr(target, "__self__", None) in (pg.mesh, pg.mesh._listener):
            kind = target.__name__.strip("_").split("_")[0]
            found[kind].append(thread._args[0] if kind == "read" else thread)
        elif thread is pg._worker and thread.is_alive():
            found["worker"].append(thread)
    return found


def assert_group_healthy(pgs, what: str) -> None:
    """Every thread of every group is alive, no peer is broken, and an all_reduce gives the right sums."""
    n = len(pgs)
    for pg in pgs:
        threads = backend_threads(pg)
        rank = pg.rank()
        assert len(threads["worker"]) == 1, f"after {what}: rank {rank}'s worker thread is gone"
        assert len(threads["accept"]) == 1, f"after {what}: rank {rank}'s accept thread is gone"
        assert sorted(threads["read"]) == [p for p in range(n) if p != rank], \
            f"after {what}: rank {rank} reads from peers {sorted(threads['read'])}, not all of them"
        assert not pg.mesh.broken, f"after {what}: rank {rank} sees broken peers {pg.mesh.broken}"
    results = run_on_all(pgs, all_reduce_value)
    assert results == [expected_sum(n)] * n, f"after {what}: all_reduce gave {results}, expected {expected_sum(n)}"


# ======================================================== 1. in-process worlds
def test_run_on_all_names_the_rank_that_raised_and_the_rank_that_hung():
    def fn(rank):
        if rank == 1:
            raise ValueError("boom")
        return rank

    with pytest.raises(AssertionError, match=r"rank 1 raised ValueError: boom"):
        run_on_all(range(3), fn)
    release = threading.Event()
    with pytest.raises(AssertionError, match=r"ranks \[2\] were still running"):
        run_on_all(range(3), lambda rank: release.wait(5) if rank == 2 else rank, timeout=0.2)
    release.set()


@pytest.mark.parametrize("n", [2, 3])
def test_in_process_world_runs_collectives_and_p2p(ref_world, n):
    pgs = ref_world(n)
    assert [pg.rank() for pg in pgs] == list(range(n)) and all(pg.size() == n for pg in pgs)
    assert all(pg.getBackendName() == "reference" for pg in pgs)

    assert run_on_all(pgs, all_reduce_value) == [expected_sum(n)] * n, "all_reduce SUM"
    maxes = run_on_all(pgs, lambda pg: all_reduce_value(pg, op=dist.ReduceOp.MAX))
    assert maxes == [[float(n), 10.0 * n]] * n, f"all_reduce MAX gave {maxes}"

    # large enough for the two-round (reduce-scatter + all-gather) path, and not a multiple of n
    big = 20_001
    def big_all_reduce(pg):
        t = torch.arange(big, dtype=torch.float64) * (pg.rank() + 1)
        all_reduce(pg, t).wait()
        return t
    expected = torch.arange(big, dtype=torch.float64) * sum(range(1, n + 1))
    for rank, got in enumerate(run_on_all(pgs, big_all_reduce)):
        assert torch.equal(got, expected), f"two-round all_reduce wrong on rank {rank}"

    def bcast(pg):
        t = torch.arange(5) * 7 if pg.rank() == n - 1 else torch.zeros(5, dtype=torch.int64)
        broadcast(pg, t, n - 1).wait()
        return t.tolist()
    assert run_on_all(pgs, bcast) == [[0, 7, 14, 21, 28]] * n, "broadcast from the last rank"

    def gather_all(pg):
        outs = [torch.zeros(2, dtype=torch.int32) for _ in range(n)]
        pg.allgather([outs], [torch.full((2,), pg.rank(), dtype=torch.int32)], AllgatherOptions()).wait()
        return [o.tolist() for o in outs]
    assert run_on_all(pgs, gather_all) == [[[r, r] for r in range(n)]] * n, "all_gather"

    run_on_all(pgs, lambda pg: pg.barrier(dist.BarrierOptions()).wait())

    def ring(pg):  # every rank sends to the next and receives from the previous
        rank = pg.rank()
        got = torch.zeros(3)
        recv = pg.recv([got], (rank - 1) % n, 11)
        pg.send([torch.full((3,), float(rank))], (rank + 1) % n, 11).wait()
        recv.wait()
        return got.tolist()
    assert run_on_all(pgs, ring) == [[float((r - 1) % n)] * 3 for r in range(n)], "p2p ring"


# ================================================= 2a. outsiders on the listener
def knock(port: int, payload: bytes, host: str = "127.0.0.1", timeout: float = 5.0) -> str:
    """Connect as an outsider, send payload, and wait until the backend drops the connection.

    Returns "closed" (EOF) or "reset"; raises AssertionError if the backend answers
    with bytes or keeps the connection open for ``timeout`` seconds.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)  # a truncated frame ends here: no waiting for bytes that never come
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN: already refused before we finished
            return "reset"
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            return "reset"
        except socket.timeout:
            raise AssertionError(f"the backend kept an outsider's connection open for {timeout:g} s after "
                                 f"{payload[:64]!r}... ({len(payload)} bytes)") from None
        assert answer == b"", f"the backend answered an outsider with {answer!r}"
        return "closed"


def frame(kind=wire.HELLO, meta: bytes = b"", *, magic=wire.MAGIC, version=wire.VERSION, tag=0,
          meta_len: int | None = None, data_len: int = 0, data: bytes = b"") -> bytes:
    return wire.HEADER.pack(magic, version, kind, tag, len(meta) if meta_len is None else meta_len, data_len) \
        + meta + data


def hello(token, rank, **fields) -> bytes:
    return frame(wire.HELLO, json.dumps({"token": token, "rank": rank}).encode(), **fields)


U8, U32 = st.integers(0, 255), st.integers(0, 2**32 - 1)
U64, I64 = st.integers(0, 2**64 - 1), st.integers(-2**63, 2**63 - 1)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=6)


@st.composite
def outsider(draw, token: str, n: int):
    """(target rank, bytes an outsider sends, a text the refusal reason must contain, or None for any)."""
    target = draw(st.integers(0, n - 1))
    kind = draw(st.sampled_from(["random", "truncated header", "mutated header", "wrong token", "bad rank",
                                 "connected rank", "lengths", "not hello", "bad meta"]))
    if kind == "random":
        return target, draw(st.binary(max_size=300)), None
    if kind == "truncated header":
        cut = draw(st.integers(0, wire.HEADER.size - 1))
        return target, hello(token, n - 1)[:cut], "truncated" if cut else None
    if kind == "mutated header":
        magic = draw(st.binary(min_size=4, max_size=4) | st.just(wire.MAGIC))
        version = draw(U8 | st.just(wire.VERSION))
        frame_kind = draw(U8 | st.sampled_from(list(wire.KINDS)))
        if magic != wire.MAGIC:
            expected = "bad magic"
        elif version != wire.VERSION:
            expected = "unsupported protocol version"
        elif frame_kind not in wire.KINDS:
            expected = "unknown frame kind"
        else:  # make one field invalid
            frame_kind = draw(st.integers(4, 255) | st.just(0))
            expected = "unknown frame kind"
        raw = wire.HEADER.pack(magic, version, frame_kind, draw(I64), draw(U32), draw(U64))
        return target, raw + draw(st.binary(max_size=64)), expected
    if kind == "wrong token":
        bad = draw(st.text(max_size=40).filter(lambda t: t != token) | JSON.filter(lambda v: not isinstance(v, str))
                   | st.just(token[:-1]) | st.just(token.upper() if token.upper() != token else token + "0"))
        if draw(st.booleans()):
            return target, hello(bad, n - 1), "wrong world token"
        meta = json.dumps({"rank": n - 1}).encode()  # no token at all
        return target, frame(wire.HELLO, meta), "wrong world token"
    if kind == "bad rank":
        rank = draw(st.integers(-2**70, target) | st.integers(n, 2**70) | st.booleans() | st.none()
                    | st.floats() .map(lambda f: f if f == f else 0.5) | st.text(max_size=5) | st.lists(U8, max_size=2))
        return target, hello(token, rank), "is not a rank that dials"
    if kind == "connected rank":
        if target == n - 1:  # the last rank dials everyone and is dialled by no one
            return target, hello(token, target), "is not a rank that dials"
        return target, hello(token, draw(st.integers(target + 1, n - 1))), "already connected"
    if kind == "lengths":
        meta = json.dumps({"token": token, "rank": n - 1}).encode()
        which = draw(st.sampled_from(["meta too long", "data too long", "data in hello", "meta short"]))
        if which == "meta too long":
            return target, frame(wire.HELLO, meta, meta_len=draw(st.integers(wire.MAX_META + 1, 2**32 - 1))), "exceeds"
        if which == "data too long":
            return target, frame(wire.HELLO, meta, data_len=draw(st.integers(wire.MAX_DATA + 1, 2**64 - 1))), "exceeds"
        if which == "data in hello":
            data_len = draw(st.integers(1, wire.MAX_DATA))
            return target, frame(wire.HELLO, meta, data_len=data_len, data=b"\0" * min(data_len, 16)), \
                f"{data_len} data bytes"
        return target, frame(wire.HELLO, meta, meta_len=draw(st.integers(len(meta) + 1, wire.MAX_META))), "truncated"
    if kind == "not hello":
        meta = json.dumps({"token": token, "rank": n - 1, "seq": 1, "step": 0}).encode()
        return target, frame(draw(st.sampled_from([wire.P2P, wire.COLL])), meta), "not hello"
    # bad meta: not UTF-8, not JSON, not an object, or nested deeper than the parser's recursion limit
    meta = draw(st.binary(max_size=40).filter(lambda b: not _is_json_object(b))
                | JSON.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode())
                | st.integers(1, 60_000).map(lambda depth: b"[" * depth + b"]" * depth)
                | st.integers(1, 30_000).map(lambda depth: b'{"token":' + b'{"a":' * depth + b"1" + b"}" * (depth + 1)))
    # (a nested object shallow enough to parse is a meta without a token: refused, for that reason)
    return target, frame(wire.HELLO, meta), None if _is_json_object(meta) else "meta"


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw.decode()), dict)
    except Exception:  # noqa: BLE001
        return False


# header fields (by position in wire.HEADER) and the values at and around their limits
EDGE_VALUES = {
    1: [0, wire.VERSION + 1, 255],
    2: [0, wire.HELLO, wire.P2P, wire.COLL, 4, 255],
    3: [-2**63, -1, 0, 1, 2**63 - 1],
    4: [0, 1, 7, wire.MAX_META - 1, wire.MAX_META, wire.MAX_META + 1, 2**32 - 1],
    5: [0, 1, 8, wire.MAX_DATA, wire.MAX_DATA + 1, 2**64 - 1],
}


def mutate(rng: random.Random, raw: bytes) -> bytes:
    """raw with 1 to 4 random edits: a flipped bit, a replaced byte, a cut, an insertion, a deleted
    slice, or one header field set to a value at or around its limit."""
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        edit = rng.randrange(6)
        if edit == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif edit == 1 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif edit == 2:
            del data[rng.randrange(len(data) + 1):]
        elif edit == 3:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 8))
        elif edit == 4 and data:
            at = rng.randrange(len(data))
            del data[at:at + rng.randint(1, 8)]
        elif edit == 5 and len(data) >= wire.HEADER.size:
            fields = list(wire.HEADER.unpack(bytes(data[:wire.HEADER.size])))
            field = rng.choice(sorted(EDGE_VALUES))
            fields[field] = rng.choice(EDGE_VALUES[field])
            data[:wire.HEADER.size] = wire.HEADER.pack(*fields)
    return bytes(data)


def refused_once(pg, payload: bytes, expected: str | None, host: str = "127.0.0.1") -> str:
    """Send payload to pg's listener as an outsider; check it was refused once, for the expected reason."""
    before = len(pg.mesh.refused)
    ending = knock(pg.mesh.port, payload, host)
    # the backend records the refusal before it closes the socket, so it is there by now
    new = pg.mesh.refused[before:]
    assert len(new) == 1, (f"rank {pg.rank()} recorded {len(new)} refusals (expected 1) for an outsider's "
                           f"{payload[:80]!r} ({len(payload)} bytes; connection {ending}): {new}")
    if expected is not None:
        assert expected in new[0], f"rank {pg.rank()} refused {payload[:80]!r} because {new[0]!r}, " \
                                   f"expected a reason mentioning {expected!r}"
    return new[0]


def test_outsiders_are_refused_with_a_reason_and_the_group_survives(ref_world):
    """~25 handpicked, OUTSIDER_EXAMPLES generated and OUTSIDER_MUTANTS mutated outsider connections:
    each is refused (closed, and counted once in mesh.refused with a reason)."""
    n = 3
    pgs = ref_world(n)
    token = pgs[0].mesh._token
    assert all(pg.mesh._token == token for pg in pgs)

    handpicked = [
        (0, b"", None),  # connect and close
        (0, b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n", "bad magic"),
        (1, hello(token, 2)[:10], "truncated"),
        (0, hello("0" * 32, 1), "wrong world token"),
        (0, hello(None, 1), "wrong world token"),
        (0, hello(token, 1), "already connected"),
        (0, hello(token, 2), "already connected"),
        (1, hello(token, 0), "is not a rank that dials"),
        (0, hello(token, 0), "is not a rank that dials"),
        (0, hello(token, 3), "is not a rank that dials"),
        (0, hello(token, -1), "is not a rank that dials"),
        (0, hello(token, True), "is not a rank that dials"),
        (0, hello(token, 1.0), "is not a rank that dials"),
        (0, hello(token, "1"), "is not a rank that dials"),
        (0, hello(token, 1, meta_len=wire.MAX_META + 1), "exceeds"),
        (0, hello(token, 1, meta_len=2**32 - 1), "exceeds"),
        (0, hello(token, 1, data_len=2**64 - 1), "exceeds"),
        (0, hello(token, 1, data_len=8, data=b"\0" * 8), "8 data bytes"),
        (0, hello(token, 1, meta_len=wire.MAX_META), "truncated"),
        (0, frame(wire.COLL, json.dumps({"token": token, "rank": 1, "seq": 1, "step": 0}).encode()), "not hello"),
        (0, frame(wire.P2P, json.dumps({"token": token, "rank": 1}).encode()), "not hello"),
        (0, frame(wire.HELLO, b"\xff\xfe"), "meta"),
        (0, frame(wire.HELLO, b"[1, 2]"), "meta"),
        (0, frame(wire.HELLO, b"[" * 50_000), "meta"),  # deeper than the JSON parser's recursion limit
        (2, hello(token, 2, version=2), "unsupported protocol version"),
    ]
    for target, payload, expected in handpicked:
        refused_once(pgs[target], payload, expected)

    # a connection reset by the outsider before it sent anything (SO_LINGER 0 close)
    before = len(pgs[0].mesh.refused)
    sock = socket.create_connection(("127.0.0.1", pgs[0].mesh.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    sock.close()
    deadline = time.monotonic() + 5
    while len(pgs[0].mesh.refused) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(pgs[0].mesh.refused) == before + 1, "a connection reset by an outsider was not recorded as refused"

    sent = []

    @settings(max_examples=OUTSIDER_EXAMPLES, deadline=None, database=None)
    @given(outsider(token, n))
    def storm(case):
        target, payload, expected = case
        refused_once(pgs[target], payload, expected)
        sent.append(len(payload))

    storm()
    assert len(sent) >= OUTSIDER_EXAMPLES // 2, f"only {len(sent)} outsider connections were tried"

    rng = random.Random(SEED)
    seeds = [hello(token, rank) for rank in range(-1, n + 1)] + \
        [frame(kind, json.dumps({"token": token, "rank": 1, "seq": 1, "step": 0}).encode(), data_len=4, data=b"abcd")
         for kind in (wire.P2P, wire.COLL)]
    for _ in range(OUTSIDER_MUTANTS):
        payload = mutate(rng, rng.choice(seeds)) if rng.random() < 0.9 else rng.randbytes(rng.randrange(100))
        refused_once(pgs[rng.randrange(n)], payload, None)
        sent.append(len(payload))

    total = sum(len(pg.mesh.refused) for pg in pgs)
    assert total == len(handpicked) + 1 + len(sent), f"{total} refusals recorded for {len(handpicked) + 1 + len(sent)} outsiders"
    assert_group_healthy(pgs, f"{total} refused outsider connections")


# ================================================== 2b. wire-level garbage
def check_decode_header(raw: bytes) -> None:
    """decode_header returns exactly the valid headers' fields and raises ProtocolError for anything else."""
    if len(raw) == wire.HEADER.size:
        magic, version, kind, tag, meta_len, data_len = wire.HEADER.unpack(raw)
        valid = (magic == wire.MAGIC and version == wire.VERSION and kind in wire.KINDS
                 and meta_len <= wire.MAX_META and data_len <= wire.MAX_DATA)
    else:
        valid = False
    try:
        decoded = wire.decode_header(bytes(raw))
    except wire.ProtocolError:
        assert not valid, f"decode_header refused a valid header {raw!r}"
        return
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"decode_header raised {type(exc).__name__} (not ProtocolError) for {raw!r}: {exc}") \
            from exc
    assert valid, f"decode_header accepted an invalid header {raw!r} as {decoded}"
    assert decoded == (kind, tag, meta_len, data_len), f"decode_header({raw!r}) = {decoded}"


def check_decode_meta(raw: bytes) -> None:
    """decode_meta returns the JSON object or raises ProtocolError; never another exception, never slowly."""
    started = time.monotonic()
    try:
        meta = wire.decode_meta(bytearray(raw))
    except wire.ProtocolError:
        pass
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"decode_meta raised {type(exc).__name__} (not ProtocolError) for "
                             f"{raw[:60]!r}... ({len(raw)} bytes): {exc}") from exc
    else:
        assert isinstance(meta, dict), f"decode_meta returned a {type(meta).__name__} for {raw[:60]!r}"
        assert json.dumps(meta) == json.dumps(json.loads(bytes(raw).decode("utf-8"))), \
            f"decode_meta({raw[:60]!r}) returned {meta}"
    assert time.monotonic() - started < 2, f"decode_meta took {time.monotonic() - started:.1f} s on {raw[:60]!r}"


def _valid_shape(shape) -> bool:
    return isinstance(shape, list) and len(shape) <= wire.MAX_DIMS and \
        all(type(d) is int and 0 <= d < 2**40 for d in shape)


def check_tensor_from(meta: dict, data: bytearray) -> None:
    """tensor_from rebuilds exactly the consistent descriptions and raises ProtocolError for the others."""
    original = bytes(data)
    try:
        tensor = wire.tensor_from(meta, data)
    except wire.ProtocolError:
        return
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"tensor_from raised {type(exc).__name__} (not ProtocolError) for meta {meta!r} "
                             f"and {len(data)} data bytes: {exc}") from exc
    assert isinstance(meta.get("dtype"), str) and meta["dtype"] in wire.DTYPES and _valid_shape(meta.get("shape")), \
        f"tensor_from accepted an invalid description {meta!r}"
    assert tensor.dtype == wire.DTYPES[meta["dtype"]] and list(tensor.shape) == meta["shape"], \
        f"tensor_from({meta!r}) built a {tensor.dtype} tensor of shape {list(tensor.shape)}"
    assert bytes(wire.tensor_bytes(tensor)) == original, f"tensor_from({meta!r}) changed the bytes"


HEADER_FIELDS = st.tuples(st.binary(min_size=4, max_size=4) | st.just(wire.MAGIC),
                          U8 | st.just(wire.VERSION), U8 | st.sampled_from(list(wire.KINDS)), I64,
                          U32 | st.integers(0, wire.MAX_META + 2), U64 | st.integers(0, wire.MAX_DATA + 2))


@settings(max_examples=WIRE_EXAMPLES, deadline=None, database=None)
@given(st.one_of(st.binary(max_size=2 * wire.HEADER.size),
                 HEADER_FIELDS.map(lambda f: wire.HEADER.pack(*f)),
                 st.tuples(HEADER_FIELDS, st.integers(0, 40)).map(lambda fc: wire.HEADER.pack(*fc[0])[:fc[1]])))
def test_decode_header_accepts_valid_headers_and_raises_protocol_error_for_anything_else(raw):
    check_decode_header(raw)


@settings(max_examples=WIRE_EXAMPLES, deadline=None, database=None)
@given(st.one_of(st.binary(max_size=200),
                 JSON.map(lambda v: json.dumps(v).encode()),
                 st.tuples(JSON, st.integers(0, 50), st.binary(min_size=1, max_size=3)).map(
                     lambda v: (lambda raw: raw[:v[1]] + v[2] + raw[v[1]:])(json.dumps(v[0]).encode())),
                 st.integers(1, wire.MAX_META // 2).map(lambda depth: b"[" * depth + b"]" * depth),
                 st.integers(1, wire.MAX_META // 6).map(lambda depth: b'{"a":' * depth + b"0" + b"}" * depth)))
def test_decode_meta_returns_a_dict_or_raises_protocol_error(raw):
    check_decode_meta(raw)


SHAPE_DIM = st.one_of(st.integers(0, 4), st.integers(-2**41, 2**41), st.booleans(), st.floats(), st.text(max_size=3),
                      st.none(), st.lists(U8, max_size=2))


@st.composite
def tensor_descriptions(draw):
    """(meta, data): often consistent (a real tensor's), often garbled in one field or in its length."""
    if draw(st.booleans()):  # start from a consistent description and maybe garble it
        name = draw(st.sampled_from(sorted(wire.DTYPES)))
        shape = draw(st.lists(st.integers(0, 3), max_size=4))
        numel = 1
        for dim in shape:
            numel *= dim
        nbytes = numel * torch.empty((), dtype=wire.DTYPES[name]).element_size()
        data = draw(st.binary(min_size=nbytes, max_size=nbytes))
        meta = {"dtype": name, "shape": shape}
        garble = draw(st.sampled_from(["none", "dtype", "shape", "dim", "data", "huge zero", "extra"]))
        if garble == "dtype":
            meta["dtype"] = draw(JSON | st.sampled_from(["float", "torch.float32", "Float32", "qint8"]))
        elif garble == "shape":
            meta["shape"] = draw(JSON | st.lists(SHAPE_DIM, max_size=20))
        elif garble == "dim" and shape:
            shape[draw(st.integers(0, len(shape) - 1))] = draw(SHAPE_DIM)
        elif garble == "data":
            data = draw(st.binary(max_size=80))
        elif garble == "huge zero":  # zero elements, but dimensions whose product overflows int64
            meta["shape"] = [0] + draw(st.lists(st.integers(2**30, 2**40 - 1), min_size=2, max_size=15))
            draw(st.randoms()).shuffle(meta["shape"])
            data = b""
        elif garble == "extra":
            meta.update(draw(st.dictionaries(st.text(max_size=4), JSON, max_size=3)))
        return meta, bytearray(data)
    meta = draw(st.dictionaries(st.sampled_from(["dtype", "shape", "x"]), JSON | st.lists(SHAPE_DIM, max_size=4),
                                max_size=3))
    return meta, bytearray(draw(st.binary(max_size=40)))


@settings(max_examples=WIRE_EXAMPLES, deadline=None, database=None)
@given(tensor_descriptions())
def test_tensor_from_rebuilds_consistent_tensors_and_raises_protocol_error_otherwise(description):
    check_tensor_from(*description)


# values a garbled meta field can take in the seeded loops
ODD_VALUES = [None, True, False, 0, -1, 1.5, float("inf"), 2**40, 2**63, -2**63, "", "float32 ", "FLOAT32",
              "torch.float32", "qint8", [], [[]], [1, [2]], {}, {"dtype": "float32"}, [-1], [2**40], [True],
              [0] + [2**39] * 15, [0] * 17, [1] * 16, [2**20, 2**20, 0, 2**20, 2**20]]


def test_wire_functions_on_thousands_of_seeded_mutations():
    """WIRE_MUTANTS mutated inputs for each of decode_header, decode_meta and tensor_from."""
    rng = random.Random(SEED)
    headers = [wire.encode_header(kind, tag, b"x" * meta_len, data_len)
               for kind in wire.KINDS for tag in (0, -5, 2**40) for meta_len in (0, 9) for data_len in (0, 12)]
    for _ in range(WIRE_MUTANTS):
        check_decode_header(mutate(rng, rng.choice(headers)) if rng.random() < 0.9
                            else rng.randbytes(rng.choice([wire.HEADER.size, rng.randrange(60)])))

    metas = [wire.encode_meta(m) for m in (
        {"seq": 3, "step": 0, "fp": {"op": "all_reduce", "dtype": "float32", "shape": [2, 3], "reduce": "sum"},
         "dtype": "float32", "shape": [2, 3]},
        {"token": "ab" * 16, "rank": 2}, {"dtype": "int64", "shape": []}, {})]
    for _ in range(WIRE_MUTANTS):
        roll = rng.random()
        if roll < 0.8:
            raw = mutate(rng, rng.choice(metas))
        elif roll < 0.9:
            depth = rng.randrange(1, wire.MAX_META // 2)
            raw = rng.choice([b"[" * depth + b"]" * depth, b'{"a":' * (depth // 5) + b"1" + b"}" * (depth // 5),
                              b"[" * depth])
        else:
            raw = rng.randbytes(rng.randrange(80))
        check_decode_meta(raw)

    for _ in range(WIRE_MUTANTS):
        name = rng.choice(sorted(wire.DTYPES))
        shape = [rng.randrange(4) for _ in range(rng.randrange(4))]
        tensor = torch.zeros(shape, dtype=wire.DTYPES[name])
        data = bytearray(wire.tensor_bytes(tensor))
        meta = {"dtype": name, "shape": shape}
        for _ in range(rng.randint(0, 2)):
            edit = rng.randrange(5)
            if edit == 0:
                meta["dtype"] = rng.choice(ODD_VALUES)
            elif edit == 1:
                meta["shape"] = rng.choice(ODD_VALUES)
            elif edit == 2 and shape:
                meta["shape"] = list(shape)
                meta["shape"][rng.randrange(len(shape))] = rng.choice(ODD_VALUES)
            elif edit == 3:
                data = bytearray(mutate(rng, bytes(data)))
            else:
                meta.pop(rng.choice(["dtype", "shape"]), None)
        check_tensor_from(meta, data)


# ============================================ 2c. a connected peer's garbled frame
def _coll(meta: dict | bytes, **fields) -> bytes:
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return frame(wire.COLL, raw, **fields)


GARBLED_FRAMES = {
    "garbage bytes": b"garbage! " * 8,
    "bad version": _coll({"seq": 1, "step": 0}, version=7),
    "unknown kind": frame(200, b"{}"),
    "meta too long": _coll(b"{}", meta_len=wire.MAX_META + 1),
    "data too long": _coll(b"{}", data_len=wire.MAX_DATA + 1),
    "meta not JSON": _coll(b"\xff{not json"),
    "meta a list": _coll(b"[1,2,3]"),
    "meta nested too deep": _coll(b"[" * 40_000 + b"]" * 40_000),
    "collective without seq": _coll({"step": 0, "fp": {}}),
    "hello after the handshake": hello("x" * 32, 0),
}


@pytest.mark.parametrize("garble", sorted(GARBLED_FRAMES))
def test_a_peer_sending_a_garbled_frame_is_broken_and_every_wait_on_it_fails_naming_it(ref_world, garble):
    timeout_s = 5.0
    pgs = ref_world(3, timeout=timedelta(seconds=timeout_s))
    bad, victim = 0, 1
    # waiting before the garbage arrives: a collective (all three ranks' frames needed) and a recv from rank 0
    got = torch.zeros(2)
    pending_recv = pgs[victim].recv([got], bad, 5)
    t = torch.ones(2)
    pending_coll = all_reduce(pgs[victim], t)
    assert not pending_recv.is_completed() and not pending_coll.is_completed()

    started = time.monotonic()
    pgs[bad].mesh._conns[victim].sendall(GARBLED_FRAMES[garble])

    def raised_by(work, what):
        try:
            work.wait()
        except Exception as exc:  # noqa: BLE001
            return exc
        raise AssertionError(f"{what} on rank {victim} succeeded after rank {bad} sent a garbled frame ({garble})")

    for work, what in [(pending_coll, "a pending all_reduce"), (pending_recv, "a pending recv from rank 0")]:
        exc = raised_by(work, what)
        elapsed = time.monotonic() - started
        assert "rank 0 sent a malformed frame" in str(exc), \
            f"{what} on rank {victim} raised {type(exc).__name__}: {exc} -- not the malformed frame from rank 0"
        assert elapsed < timeout_s / 2, f"{what} took {elapsed:.2f} s to fail (group timeout {timeout_s} s)"
        assert work.exception() is not None
    assert "malformed frame" in pgs[victim].mesh.broken.get(bad, ""), \
        f"rank {victim} did not mark rank {bad} broken: {pgs[victim].mesh.broken}"

    # new operations involving rank 0 fail at once; rank 2 is still fine to talk to
    exc = raised_by(pgs[victim].recv([got], bad, 6), "a new recv from rank 0")
    assert "malformed frame" in str(exc), f"a recv posted after the break raised {exc}"
    with pytest.raises(RuntimeError, match="malformed frame"):
        pgs[victim].send([torch.ones(1)], bad, 1).wait()
    pgs[2].send([torch.full((2,), 9.0)], victim, 7).wait()
    pgs[victim].recv([got], 2, 7).wait()
    assert got.tolist() == [9.0, 9.0], "p2p between the two healthy ranks stopped working"
    assert time.monotonic() - started < timeout_s, "failing every operation on the broken peer took too long"


def test_an_unexpected_error_in_a_reader_breaks_the_peer_instead_of_killing_the_thread(ref_world, monkeypatch):
    """A reader that hits something other than ProtocolError (here MemoryError, as allocating a garbled
    multi-GiB data length would raise) must still mark the peer broken and wake everyone waiting on it."""
    pgs = ref_world(2, timeout=timedelta(seconds=5))
    decode_meta = wire.decode_meta

    def failing_decode_meta(raw):
        if bytes(raw) == b'{"boom":1}':
            raise MemoryError("simulated: no memory for the frame")
        return decode_meta(raw)

    monkeypatch.setattr(transport.wire, "decode_meta", failing_decode_meta)
    pending = all_reduce(pgs[1], torch.ones(2))
    started = time.monotonic()
    pgs[0].mesh._conns[1].sendall(_coll(b'{"boom":1}'))
    with pytest.raises(RuntimeError, match=r"rank 0 sent a frame that could not be read \(MemoryError"):
        pending.wait()
    assert time.monotonic() - started < 2.5, "the pending all_reduce waited for its timeout instead of failing"
    assert "MemoryError" in pgs[1].mesh.broken.get(0, ""), f"rank 0 not marked broken: {pgs[1].mesh.broken}"


# ============================================================ 3. agreement errors
def _a2a(pg, in_splits, out_splits):
    output = torch.zeros(sum(out_splits))
    return pg.alltoall_base(output, torch.ones(sum(in_splits)), list(out_splits), list(in_splits),
                            dist.AllToAllOptions())


def _reduce_with(op):
    return lambda pg: all_reduce(pg, torch.ones(2), op)


MISMATCHES = {
    # name: (per-rank calls, texts every rank's error must contain)
    "shape": ([_reduce_with(dist.ReduceOp.SUM)] * 2 + [lambda pg: all_reduce(pg, torch.ones(3))],
              ["shape", "[2] on ranks [0, 1]", "[3] on ranks [2]"]),
    "dtype": ([_reduce_with(dist.ReduceOp.SUM), lambda pg: all_reduce(pg, torch.ones(2, dtype=torch.int64)),
               _reduce_with(dist.ReduceOp.SUM)],
              ["dtype", "'float32' on ranks [0, 2]", "'int64' on ranks [1]"]),
    "operation": ([lambda pg: broadcast(pg, torch.ones(2), 0)] + [_reduce_with(dist.ReduceOp.SUM)] * 2,
                  ["op", "'broadcast' on ranks [0]", "'all_reduce' on ranks [1, 2]"]),
    "root": ([lambda pg: broadcast(pg, torch.ones(2), 0)] * 2 + [lambda pg: broadcast(pg, torch.ones(2), 2)],
             ["root", "0 on ranks [0, 1]", "2 on ranks [2]"]),
    "reduce op": ([_reduce_with(dist.ReduceOp.SUM), _reduce_with(dist.ReduceOp.MAX), _reduce_with(dist.ReduceOp.SUM)],
                  ["reduce", "'sum' on ranks [0, 2]", "'max' on ranks [1]"]),
    "all_to_all_single splits": ([lambda pg: _a2a(pg, [1, 1, 1], [1, 1, 1]),
                                  lambda pg: _a2a(pg, [1, 1, 1], [2, 1, 1]),
                                  lambda pg: _a2a(pg, [1, 1, 1], [1, 1, 1])],
                                 ["rank 0 sends 1 rows to rank 1, which expects 2"]),
}


@pytest.mark.parametrize("mismatch", list(MISMATCHES))
def test_disagreeing_ranks_all_raise_naming_the_ranks_and_the_difference(ref_world, mismatch):
    calls, texts = MISMATCHES[mismatch]
    pgs = ref_world(3)

    def call(pg):
        calls[pg.rank()](pg).wait()

    outcomes = run_each(pgs, call)
    for rank, outcome in enumerate(outcomes):
        assert isinstance(outcome, CollectiveMismatch), \
            f"{mismatch} mismatch: rank {rank} got {outcome!r}, expected a CollectiveMismatch"
        for text in texts:
            assert text in str(outcome), f"{mismatch} mismatch: rank {rank}'s error lacks {text!r}: {outcome}"
    differences = {str(o).split("): ", 1)[-1] for o in outcomes}  # each names its own call in "(...)"
    assert len(differences) == 1, f"ranks described the mismatch differently: {[str(o) for o in outcomes]}"
    # every rank consumed the collective: the group is still usable
    assert run_on_all(pgs, all_reduce_value) == [expected_sum(3)] * 3, f"all_reduce after the {mismatch} mismatch"


# =================================================================== 4. timeouts
def _timed(fn):
    started = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_rank_that_skips_an_all_reduce_makes_the_others_raise_after_the_group_timeout(ref_world):
    timeout_s = 0.3
    # a subgroup of a larger world: group rank 2 is global rank 8, and the error must say both
    pgs = ref_world(3, timeout=timedelta(seconds=timeout_s), global_ranks=[4, 6, 8])

    def maybe_all_reduce(pg):
        if pg.rank() == 2:
            return None
        return _timed(lambda: all_reduce(pg, torch.ones(2)).wait())

    for rank, outcome in enumerate(run_each(pgs, maybe_all_reduce)[:2]):
        elapsed, exc = outcome
        assert exc is not None, f"rank {rank}'s all_reduce succeeded without rank 2"
        assert timeout_s <= elapsed <= timeout_s + 2, \
            f"rank {rank} raised after {elapsed:.2f} s, outside [{timeout_s}, {timeout_s + 2}] s: {exc}"
        for text in ["all_reduce", "Timed out", "ranks [2]", "global ranks [8]"]:
            assert text in str(exc), f"rank {rank}'s timeout error lacks {text!r}: {exc}"


def test_a_per_call_timeout_overrides_the_long_group_timeout(ref_world):
    pgs = ref_world(2, timeout=timedelta(seconds=60))
    elapsed, exc = _timed(lambda: all_reduce(pgs[0], torch.ones(2), timeout=timedelta(seconds=0.2)).wait())
    assert exc is not None, "an all_reduce without its peer succeeded"
    assert 0.2 <= elapsed <= 2.2, f"the per-call timeout of 0.2 s fired after {elapsed:.2f} s: {exc}"
    assert "all_reduce" in str(exc) and "ranks [1]" in str(exc), f"the timeout error names neither: {exc}"


def test_a_recv_whose_sender_never_sends_raises_naming_source_and_tag(ref_world):
    timeout_s = 0.3
    pgs = ref_world(2, timeout=timedelta(seconds=timeout_s))
    got = torch.zeros(2)
    work = pgs[1].recv([got], 0, 7)
    elapsed, exc = _timed(work.wait)
    assert exc is not None, "a recv whose sender never sent succeeded"
    assert timeout_s <= elapsed <= timeout_s + 2, f"the recv raised after {elapsed:.2f} s (group timeout {timeout_s} s)"
    assert "rank 0" in str(exc) and "tag 7" in str(exc), f"the recv's timeout error names neither source nor tag: {exc}"
    # the timed-out receive was withdrawn: a message sent now goes to the next receive, not into the void
    pgs[0].send([torch.full((2,), 4.0)], 1, 7).wait()
    pgs[1].recv([got], 0, 7).wait()
    assert got.tolist() == [4.0, 4.0], "the message went to the receive that had timed out"


# =================================================================== 5. Work API
def test_async_all_reduce_completes_only_after_every_rank_called(ref_world):
    pgs = ref_world(2)
    t0 = torch.tensor([1.0, 2.0])
    work0 = all_reduce(pgs[0], t0)
    time.sleep(0.05)
    assert not work0.is_completed(), "all_reduce completed before rank 1 had even called it"
    assert work0.exception() is None, "an unfinished Work reports an exception"
    t1 = torch.tensor([10.0, 20.0])
    work1 = all_reduce(pgs[1], t1)
    assert work0.wait() and work1.wait()
    assert work0.is_completed() and work1.is_completed() and work0.is_success()
    for work in (work0, work1):
        values = work.get_future().wait()
        assert [v.tolist() for v in values] == [[11.0, 22.0]], f"the future's value is {values}"
        assert work.exception() is None
    assert values[0] is t1, "the future's value is not the caller's tensor, reduced in place"


def test_results_land_without_recording_autograd_history_on_the_callers_tensor(ref_world):
    """The worker and reader threads write data only, never autograd history (the funcol backward bug).

    A functional all_reduce's output gets its AllReduceBackward node as soon as the op returns,
    before the worker writes the result into it. The worker's copy_ ran with grad mode on (it is
    per thread), so it rebased the output onto a CopyBackwards node whose gradient for the
    overwritten value is zero: 2-14 of 200 funcol backwards summed zeros for one rank. Here the
    caller's tensor has history *before* the call, which makes that ordering certain: every
    result must land in the tensor and leave its grad_fn the very same node (as gloo does).
    """
    pgs = ref_world(2)
    big = process_group.SMALL_ALL_REDUCE_BYTES // 4 + 8  # float32 elements: the two-round all_reduce

    def with_history(me, numel):
        x = torch.ones(numel, requires_grad=True)
        y = x * float(me + 1)  # a non-leaf, like a functional collective's output
        return x, y, y.grad_fn

    def on_rank(pg):
        me, seen = pg.rank(), {}

        def check(name, x, y, node, expected):
            y.sum().backward()  # through the history y had before the call: d(sum y)/dx = me + 1
            seen[name] = (type(y.grad_fn).__name__, y.grad_fn is node, y.detach()[:2].tolist(),
                          x.grad[:2].tolist())
            assert seen[name] == ("MulBackward0", True, expected, [float(me + 1)] * 2), \
                f"rank {me} {name}: (grad_fn, same node, values, x.grad) = {seen[name]}"

        for name, numel in (("all_reduce one round", 4), ("all_reduce two rounds", big)):
            x, y, node = with_history(me, numel)
            all_reduce(pg, y).wait()
            check(name, x, y, node, [3.0, 3.0])
        x, y, node = with_history(me, 4)
        broadcast(pg, y, root=1).wait()
        check("broadcast", x, y, node, [2.0, 2.0])
        # recv: the message arrives first (written on the caller's thread) / the recv is posted first
        # (written by the reader thread); the all_reduce in between orders the two cases
        if me == 0:
            pg.send([torch.full((4,), 7.0)], 1, 5).wait()
            all_reduce_value(pg)
            pg.send([torch.full((4,), 8.0)], 1, 6).wait()
        else:
            x6, y6, node6 = with_history(me, 4)
            posted = pg.recv([y6], 0, 6)
            all_reduce_value(pg)  # rank 0's tag-5 frame was read before its all_reduce frame
            x5, y5, node5 = with_history(me, 4)
            pg.recv([y5], 0, 5).wait()
            check("recv of an arrived message", x5, y5, node5, [7.0, 7.0])
            posted.wait()
            check("recv posted before the message", x6, y6, node6, [8.0, 8.0])
        return seen

    results = run_on_all(pgs, on_rank)
    assert set(results[1]) == {"all_reduce one round", "all_reduce two rounds", "broadcast",
                               "recv of an arrived message", "recv posted before the message"}


def test_an_error_in_an_async_op_is_raised_by_wait_and_exposed_by_exception(ref_world):
    pgs = ref_world(2)
    works = run_on_all(pgs, lambda pg: all_reduce(pg, torch.ones(2 + pg.rank())))  # shapes differ
    for rank, work in enumerate(works):
        with pytest.raises(CollectiveMismatch, match="shape"):
            work.wait()
        assert work.is_completed(), f"rank {rank}: a failed Work is not completed"
        assert not work.is_success(), f"rank {rank}: a failed Work reports success"
        assert isinstance(work.exception(), CollectiveMismatch), f"rank {rank}: exception() is {work.exception()!r}"
        with pytest.raises(CollectiveMismatch):
            work.get_future().wait()


def test_recv_anysource_reports_the_sender(ref_world):
    pgs = ref_world(3)
    # posted before the message arrives
    got = torch.zeros(2)
    work = pgs[2].recv_anysource([got], 3)
    assert not work.is_completed()
    pgs[1].send([torch.full((2,), 1.5)], 2, 3).wait()
    work.wait()
    assert work._source_rank() == 1 and got.tolist() == [1.5, 1.5], f"source {work._source_rank()}, got {got}"
    # the message is already there when the receive is posted
    pgs[0].send([torch.full((2,), 2.5)], 2, 4).wait()
    deadline = time.monotonic() + 5
    while not pgs[2].mesh.mailbox.frames.get(("p2p", 0, 4)) and time.monotonic() < deadline:
        time.sleep(0.005)
    work = pgs[2].recv_anysource([got], 4)
    work.wait()
    assert work._source_rank() == 0 and got.tolist() == [2.5, 2.5], f"source {work._source_rank()}, got {got}"


# ================================================================ 6. life cycle
def _threads_of(pgs) -> list[threading.Thread]:
    owners = [pg.mesh for pg in pgs] + [pg.mesh._listener for pg in pgs]  # the accept loop is the listener's
    return [pg._worker for pg in pgs] + [
        t for t in threading.enumerate() if any(getattr(getattr(t, "_target", None), "__self__", None) is m
                                                for m in owners)]


def test_shutdown_ends_every_thread_and_closes_the_listener(ref_world):
    pgs = ref_world(3)
    run_on_all(pgs, all_reduce_value)
    threads, ports = _threads_of(pgs), [pg.mesh.port for pg in pgs]
    assert len(threads) == 3 * (1 + 1 + 2), f"expected a worker, an accept and 2 reader threads per rank: {threads}"
    for pg in pgs:
        pg.shutdown()
    for thread in threads:
        thread.join(2.0)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running 2 s after shutdown(): {alive}"
    for rank, port in enumerate(ports):
        with pytest.raises(ConnectionRefusedError):  # nothing may listen on a shut-down group's port
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_the_exit_hook_shuts_groups_down_and_waits_for_their_threads(ref_world):
    """At interpreter exit a backend daemon thread must not still be in torch's C++ code (dropping the
    last reference to a Work releases and retakes the GIL): finalization would kill it with
    std::terminate and the process, after a clean run, aborts. The atexit hook joins them first."""
    pgs = ref_world(2)
    run_on_all(pgs, all_reduce_value)
    works = run_on_all(pgs, lambda pg: all_reduce(pg, torch.ones(1)))  # completed, still referenced
    run_on_all(works, lambda work: work.wait())
    threads = [t for t in _threads_of(pgs) if "accept" not in t.name]
    process_group._stop_threads_before_exit()
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"the exit hook returned while backend threads still run: {alive}"


# ================================================ 7. plain torch.distributed
def test_two_processes_use_the_backend_through_plain_torch_distributed(tmp_path):
    store = str(tmp_path / "filestore")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.reference_cases.plain_dist", str(rank), "2", store],
                              cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"rank {rank} of the plain torch.distributed world hung") from None
        assert proc.returncode == 0, f"rank {rank} exited with {proc.returncode}:\n{err[-3000:]}"
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert lines, f"rank {rank} printed no result:\n{out[-2000:]}\n{err[-2000:]}"
        results.append(json.loads(lines[-1][len("RESULT "):]))
    for rank, result in enumerate(results):
        expected = {
            "backend": "reference", "rank": rank, "world_size": 2,
            "all_reduce_sum": [3.0] * 3, "all_reduce_max": [2, 20], "broadcast": [100, 101, 102, 103],
            "all_gather": [[0.0, 0.0], [1.0, 1.0]], "p2p": None if rank == 0 else [7.0, 8.0],
            "new_group_all_reduce": [3.0, 3.0], "new_group_backend": "reference",
            "singleton_all_reduce": [float(rank + 5)], "initialized_after_destroy": False,
        }
        wrong = {k: (result.get(k), v) for k, v in expected.items() if result.get(k) != v}
        assert not wrong, f"rank {rank}: (got, expected) per call: {wrong}"


# ============================================================ 8. where it listens
def test_the_listener_binds_to_loopback_by_default(ref_world):
    pgs = ref_world(2)
    for pg in pgs:
        host, port = pg.mesh._listener.address
        assert host == "127.0.0.1", f"rank {pg.rank()} listens on {host}, not loopback"
        assert port == pg.mesh.port


def test_the_host_env_var_and_argument_move_the_listener(ref_world, monkeypatch):
    monkeypatch.setenv("DISTCONFORM_REFERENCE_HOST", "127.0.0.2")
    pgs = ref_world(2)
    for pg in pgs:
        host = pg.mesh._listener.address[0]
        assert host == "127.0.0.2", f"with DISTCONFORM_REFERENCE_HOST=127.0.0.2 rank {pg.rank()} listens on {host}"
    assert run_on_all(pgs, all_reduce_value) == [expected_sum(2)] * 2, "the world on 127.0.0.2 does not work"
    with pytest.raises(ConnectionRefusedError):  # nothing listens on the default address
        socket.create_connection(("127.0.0.1", pgs[0].mesh.port), timeout=2).close()
    refused_once(pgs[0], hello("0" * 32, 1), "wrong world token", host="127.0.0.2")

    pgs = ref_world(2, host="127.0.0.3")  # the argument wins over the variable
    assert {pg.mesh._listener.address[0] for pg in pgs} == {"127.0.0.3"}
    assert run_on_all(pgs, all_reduce_value) == [expected_sum(2)] * 2, "the world on 127.0.0.3 does not work"


def test_tensor_bytes_of_a_one_element_strided_view():
    """torch calls a one-element view with stride 2 contiguous; its bytes must still be its element.

    Found by the differential suite (all_to_all_single of a strided int64 input at world size 4).
    """
    base = torch.arange(8, dtype=torch.int64) + 40
    view = base[::2][1:2]  # one element, stride 2
    assert view.is_contiguous() and view.stride() == (2,)
    data = bytearray(wire.tensor_bytes(view))
    assert torch.equal(wire.tensor_from(wire.tensor_meta(view), data), view)
    column = base.reshape(4, 2)[:, :1]  # shape (4, 1), strides (2, 1): not contiguous
    assert torch.equal(wire.tensor_from(wire.tensor_meta(column), bytearray(wire.tensor_bytes(column))), column)


def test_tensor_bytes_of_an_empty_strided_slice():
    """An empty slice of a strided view keeps its stride; its bytes are none, not a view error.

    Found by the differential suite (all_to_all_single of an empty non-contiguous float64
    input at world size 3: "self.stride(-1) must be 1 to view Double as Byte").
    """
    empty = torch.arange(6, dtype=torch.float64)[::2][:0]
    assert empty.stride() == (2,)
    assert bytes(wire.tensor_bytes(empty)) == b""
    assert torch.equal(wire.tensor_from(wire.tensor_meta(empty), bytearray()), empty)
