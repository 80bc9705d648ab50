"""The reference backend's transport (backends/reference/transport.py) under attack, in one process.

On a world of ReferenceProcessGroups built in threads of this process
(tests/reference_cases/thread_world.py):

* thousands of outsider connections with garbage, truncated or forged frames
  are all refused (and counted, with a reason), and the group still works;
* a connected peer that sends a garbled frame is marked broken, so everything
  waiting on it fails at once, naming it, while the other peers stay usable;
* the listener binds to loopback unless told otherwise.

An autouse fixture fails any test during which a backend thread (named
``reference-*``) died of an exception.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.reference import transport, wire
from tests.reference_cases.fuzz_inputs import (
    I64,
    JSON,
    OUTSIDER_EXAMPLES,
    OUTSIDER_MUTANTS,
    SEED,
    U8,
    U32,
    U64,
    mutate,
)
from tests.reference_cases.thread_world import all_reduce, all_reduce_value, expected_sum, run_on_all
from tests.reference_cases.thread_world import backend_threads_never_die, ref_world  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.timeout(120)


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


def test_an_interface_variable_picks_the_address_as_users_pick_gloos(monkeypatch):
    """DISTCONFORM_REFERENCE_IFNAME (reference) and TP_SOCKET_IFNAME (reference-tp) name an interface, as gloo's do."""
    from backends.reference.handshake import listen_host

    monkeypatch.setenv("DISTCONFORM_REFERENCE_IFNAME", "lo")
    assert listen_host("DISTCONFORM_REFERENCE_IFNAME", "DISTCONFORM_REFERENCE_HOST") == "127.0.0.1"
    monkeypatch.setenv("DISTCONFORM_REFERENCE_HOST", "127.0.0.2")  # an address wins over an interface
    assert listen_host("DISTCONFORM_REFERENCE_IFNAME", "DISTCONFORM_REFERENCE_HOST") == "127.0.0.2"
    monkeypatch.setenv("TP_SOCKET_IFNAME", "no-such-if0")
    with pytest.raises(ValueError, match="TP_SOCKET_IFNAME='no-such-if0': no IPv4 address on that interface"):
        listen_host("TP_SOCKET_IFNAME")
