"""The reference distributed autograd's own machinery: its frames, fuzzed, and an agent fed garbled ones.

Contract: the autograd frames (FORWARD_AUTOGRAD_REQ/_RESP envelope,
BACKWARD_AUTOGRAD_REQ, CLEANUP_AUTOGRAD_CONTEXT_REQ, RREF_BACKWARD_REQ;
backends/reference/rpc/autograd/messages.py) round-trip, and any header or
tensor count that is not a valid frame raises ProtocolError saying what is
wrong, never another exception (hypothesis feeds arbitrary bytes). A live
agent that receives garbled autograd requests from a peer answers each one
with an error naming that peer and the message kind, keeps the connection and
keeps serving every peer; a well-formed request for a context it does not
have is answered with torch's "Could not find autograd context with id".
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.reference.rpc import serialize, tp_codec
from backends.reference.rpc.autograd import messages
from backends.reference.rpc.autograd.messages import ProtocolError
from backends.reference.rpc.transport import Frame, Kind
from tests.rpc_cases import agent_fns as fns
from tests.rpc_cases.in_process import agents_with_fake_peer

pytestmark = pytest.mark.timeout(120)

SLACK_S = 3.0  # two cores shared by many processes
# The killed-worker case measures from the worker's death to the caller's error; reference-pg's request fails
# by the 5 s RPC timeout (counted from its send, before the death), checked by a thread the load delays. A
# wait past a second timeout (10 s) or a hang still fails.
KILL_SLACK_S = 4.5
REQUESTS = frozenset(int(k) for k in (Kind.SCRIPT_CALL, Kind.PYTHON_CALL, Kind.PYTHON_RREF_FETCH_CALL))


# =================================================================== codecs
def test_frames_round_trip():
    header = messages.encode_forward(int(Kind.PYTHON_CALL), (3 << 48) | 7, (3 << 48) | 9, 3, [0, 2], b"inner")
    meta, inner = messages.decode_forward(header, 3, 3, REQUESTS)
    assert (meta.wrapped_kind, meta.context_id, meta.msg_id, meta.from_worker, meta.grad_indices, inner) == \
        (int(Kind.PYTHON_CALL), (3 << 48) | 7, (3 << 48) | 9, 3, [0, 2], b"inner")
    assert messages.decode_propagate(messages.encode_propagate(5, 6, True, 2), 2) == (5, 6, True)
    assert messages.decode_cleanup(messages.encode_cleanup(1 << 50), 0) == 1 << 50
    assert messages.decode_rref_backward(messages.encode_rref_backward((1, 42), 9, False), 0) == ((1, 42), 9, False)


def _forward(kind=int(Kind.PYTHON_CALL), context=1, msg=2, worker=1, indices=(0,), inner=b"x"):
    return messages.encode_forward(kind, context, msg, worker, list(indices), inner)


MALFORMED = [
    ("forward", lambda: messages.decode_forward(b"\x02" * 5, 1, 1, REQUESTS), "shorter than its"),
    ("forward", lambda: messages.decode_forward(_forward(kind=99), 1, 1, REQUESTS), "wraps message kind 99"),
    ("forward", lambda: messages.decode_forward(_forward(worker=2), 1, 1, REQUESTS), "claims worker 2"),
    ("forward", lambda: messages.decode_forward(_forward(indices=(0, 1)), 1, 1, REQUESTS), "2 tensors requiring"),
    ("forward", lambda: messages.decode_forward(_forward(indices=(1, 0)), 2, 1, REQUESTS), "not ascending"),
    ("forward", lambda: messages.decode_forward(_forward(indices=(3,)), 2, 1, REQUESTS), "not ascending below 2"),
    ("forward", lambda: messages.decode_forward(_forward()[:messages.FORWARD.size + 2], 1, 1, REQUESTS),
     "truncated"),
    ("propagate", lambda: messages.decode_propagate(b"\x00" * 3, 0), "header of 3 bytes"),
    ("propagate", lambda: messages.decode_propagate(messages.encode_propagate(1, 2, True, 3), 2),
     "announces 3 gradients, the frame has 2"),
    ("propagate", lambda: messages.decode_propagate(messages.PROPAGATE.pack(1, 2, 7, 0), 0), "flag 7"),
    ("cleanup", lambda: messages.decode_cleanup(b"\x00" * 9, 0), "clean-up request of 9 bytes"),
    ("cleanup", lambda: messages.decode_cleanup(messages.encode_cleanup(1), 1), "and 1 tensors"),
    ("rref", lambda: messages.decode_rref_backward(b"", 0), "RRef backward request of 0 bytes"),
    ("rref", lambda: messages.decode_rref_backward(messages.RREF_BACKWARD.pack(0, 1, 2, 3), 0), "flag 3"),
]


@pytest.mark.parametrize("what,decode,text", MALFORMED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_frames_say_what_is_wrong(what, decode, text):
    with pytest.raises(ProtocolError, match=text.replace("(", r"\(")):
        decode()


def test_grad_indices_must_point_at_floating_tensors():
    with pytest.raises(ProtocolError, match="tensor 0 is marked as requiring grad but is torch.int64"):
        messages.check_grad_tensors([torch.arange(3)], [0])


@settings(max_examples=400, deadline=None)
@given(raw=st.binary(max_size=64), n_tensors=st.integers(0, 4), src=st.integers(0, 3))
def test_arbitrary_bytes_are_a_frame_or_a_protocol_error(raw, n_tensors, src):
    for decode in (lambda: messages.decode_forward(raw, n_tensors, src, REQUESTS),
                   lambda: messages.decode_propagate(raw, n_tensors),
                   lambda: messages.decode_cleanup(raw, n_tensors),
                   lambda: messages.decode_rref_backward(raw, n_tensors)):
        try:
            decode()
        except ProtocolError:
            pass


# =================================================================== a live agent
def _garbled(rng: random.Random):
    """(kind, header, tensors) of an autograd request that is not a valid one."""
    kind = rng.choice([Kind.BACKWARD_AUTOGRAD_REQ, Kind.CLEANUP_AUTOGRAD_CONTEXT_REQ, Kind.RREF_BACKWARD_REQ,
                       Kind.FORWARD_AUTOGRAD_REQ])
    choice = rng.randrange(4)
    if choice == 0:  # random bytes
        header = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
    elif choice == 1:  # a valid header of another kind
        header = messages.encode_propagate(1, 2, True, 3) if kind != Kind.BACKWARD_AUTOGRAD_REQ \
            else messages.encode_cleanup(5)
    elif choice == 2:  # counts that disagree with the tensors
        header = {Kind.BACKWARD_AUTOGRAD_REQ: messages.encode_propagate(1, 2, False, 5),
                  Kind.CLEANUP_AUTOGRAD_CONTEXT_REQ: messages.encode_cleanup(3),
                  Kind.RREF_BACKWARD_REQ: messages.encode_rref_backward((0, 1), 2, True),
                  Kind.FORWARD_AUTOGRAD_REQ: _forward(worker=2, indices=(0, 1, 2))}[kind]
        return int(kind), header, [torch.ones(2)]
    else:  # an envelope claiming another sender
        kind = Kind.FORWARD_AUTOGRAD_REQ
        header = _forward(worker=0)
    return int(kind), header, []


def test_garbled_autograd_requests_are_refused_naming_the_peer():
    """Agents in one process, this test as rank 2: every garbled autograd request gets an error naming worker2 and its kind; the connection stays and every peer is still served."""
    with agents_with_fake_peer(dial_timeout=10) as live, live.fake[0].makefile("rb") as stream:
        rng = random.Random(20261125)
        for msg_id in range(1, 121):
            kind, header, tensors = _garbled(rng)
            for part in tp_codec.encode(Frame(kind, msg_id, header, tensors)):
                live.fake[0].sendall(part)
            answer = tp_codec.read_frame(stream)
            assert answer.msg_id == msg_id and answer.kind == int(Kind.EXCEPTION), answer
            exc_type, text, _ = serialize.loads(answer.header, answer.tensors)
            assert "refused a malformed" in text and "name=worker2" in text and Kind(kind).name in text, text
            if msg_id % 40 == 0:  # every peer is still served, both ways
                assert torch.equal(live.call(1, 0, fns.add, torch.ones(2), 1).wait(), torch.full((2,), 2.0))
                assert torch.equal(live.call(0, 1, fns.add, torch.ones(2), 2).wait(), torch.full((2,), 3.0))
        # a well-formed request for a context agent 0 does not have: torch's text as the answer
        for part in tp_codec.encode(Frame(int(Kind.BACKWARD_AUTOGRAD_REQ), 999,
                                          messages.encode_propagate(12345, 1, False, 1), [torch.ones(1)])):
            live.fake[0].sendall(part)
        answer = tp_codec.read_frame(stream)
        value, _ = serialize.loads(answer.header, answer.tensors)
        assert answer.kind == int(Kind.PYTHON_RET) and value == "Could not find autograd context with id: 12345"
        assert not live.agents[0].transport.dropped, "a garbled autograd request must not cost the peer its connection"


# =================================================================== a worker killed mid-backward
@pytest.mark.parametrize("agent", ["reference-tp", "reference-pg", "tensorpipe"])
def test_worker_killed_mid_backward_fails_the_caller_in_time(tmp_path, agent):
    """Worker 1 dies (os._exit) inside its part of the backward: the caller's backward raises "Error on Node 0: ..." within the RPC timeout (plus slack) of the death, and leaving the context does not hang.

    Measured: TensorPipe and reference-tp see the closed connection (torch's
    "eof", "rank 1 closed the connection"); reference-pg's gloo pair reports a
    dead peer only to a send, so its propagate request fails by the RPC timeout.
    """
    import multiprocessing

    from tests.rpc_cases import autograd_kill

    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    procs = [spawn.Process(target=autograd_kill.run, args=(r, 2, agent, str(tmp_path / "rdv"), results))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        (kind, text), took, entries, exited = results.get(timeout=90)
        for p in procs:
            p.join(30)
        print(f"{agent}: {kind}: {text} {took:.2f} s after the worker died")
        assert kind == "RuntimeError" and text.startswith("Error on Node 0: "), (kind, text)
        assert took < autograd_kill.RPC_TIMEOUT_S + KILL_SLACK_S, f"{agent}: raised {took:.1f} s after the worker died"
        assert exited and entries == 0
        assert procs[1].exitcode == 3, f"worker 1 exit code {procs[1].exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
