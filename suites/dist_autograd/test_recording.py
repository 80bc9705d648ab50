"""Contract: an RPC made inside a context records a send function on the sender and a recv function on the receiver.

A message carrying tensors that require grad gets one send function on its
sender (next functions: the grad functions of those tensors, in argument
order) and one recv function on its receiver (the grad function of every
such tensor that arrived), both keyed by the same autograd message id, taken
from the sender's counter (so ``id >> 48`` is the sender). Responses are
messages too: a result requiring grad comes back with the callee's send and
the caller's recv (``ret.grad_fn`` is that recv function). Requests,
responses, ``rpc_async`` futures, ``remote`` (the request) and ``to_here``
(the fetch's response), and calls to self all record. The context travels,
adding the callee to the caller's known workers, when a tensor requires grad
or the call is a Python function (forced); a builtin operator without such
tensors leaves the callee without the context. Introspection is each
implementation's own: ``_current_context()._send_functions()`` /
``_recv_functions()`` ({message id: node}, ids ascending) and
``_known_worker_ids()``; node names are data (common.SEND_NODE_NAME).
"""

import threading

import pytest
import torch

from fixtures.rank import ctx
from suites.dist_autograd.common import (RECV_NODE_NAME, SEND_NODE_NAME, WORKER_BITS, autograd, constant_len,
                                         context_state, has_context, leaves, mul, peer_name, rpc)


def _node_names(found):
    sends, recvs = found._send_functions(), found._recv_functions()
    return [n.name() for n in sends.values()], [n.name() for n in recvs.values()]


def _without_context(fn, *args):
    """``fn(*args)`` from a fresh thread, which has no current context (so the RPC carries none)."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn(*args)))
    thread.start()
    thread.join(30)
    return out.get("value")


# ---------------------------------------------------------------- rank side
def sync_builtin_graph():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        ret = rpc().rpc_sync(peer_name(), torch.add, args=(t1, t2))
        found = mod._current_context()
        sends, recvs = found._send_functions(), found._recv_functions()
        (send_id, send), = sends.items()
        (recv_id, recv), = recvs.items()
        next_vars = [fn.variable is t for (fn, _), t in zip(send.next_functions, (t1, t2))]
        callee = rpc().rpc_sync(peer_name(), context_state, args=(context_id,))
        return dict(send_id=send_id, recv_id=recv_id, next_vars=next_vars, ret_is_recv=ret.grad_fn is recv,
                    names=_node_names(found), known=sorted(found._known_worker_ids()), callee=callee,
                    next_nr=[nr for _, nr in send.next_functions])


def async_udf_graph():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        ret = rpc().rpc_async(peer_name(), mul, args=(t1, t2)).wait()
        found = mod._current_context()
        recvs = found._recv_functions()
        callee = rpc().rpc_sync(peer_name(), context_state, args=(context_id,))
        return (len(found._send_functions()), len(recvs), ret.grad_fn is next(iter(recvs.values())), callee)


def remote_then_to_here():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        rref = rpc().remote(peer_name(), torch.add, args=(t1, t2))
        rref.to_here()  # wait for the owner; the fetch's response brings the value back
        found = mod._current_context()
        sends, recvs = list(found._send_functions()), list(found._recv_functions())
        callee = rpc().rpc_sync(peer_name(), context_state, args=(context_id,))
        return sends, recvs, callee


def remote_before_to_here():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context():
        rref = rpc().remote(peer_name(), torch.add, args=(t1, t2))
        rref._get_future().wait()
        found = mod._current_context()
        before = (len(found._send_functions()), len(found._recv_functions()))
        value = rref.to_here()
        after = (len(found._send_functions()), len(found._recv_functions()))
        return before, after, value.grad_fn is next(iter(found._recv_functions().values()))


def builtin_without_grad():
    mod = autograd()
    with mod.context() as context_id:
        rpc().rpc_sync(peer_name(), torch.add, args=(torch.ones(2), torch.ones(2)))
        found = mod._current_context()
        mine = (len(found._send_functions()), len(found._recv_functions()), sorted(found._known_worker_ids()))
        callee_has = _without_context(rpc().rpc_sync, peer_name(), has_context, (context_id,))
    return mine, callee_has


def udf_without_tensors():
    mod = autograd()
    with mod.context() as context_id:
        value = rpc().rpc_sync(peer_name(), constant_len)
        found = mod._current_context()
        mine = (len(found._send_functions()), len(found._recv_functions()), sorted(found._known_worker_ids()))
        callee_has = _without_context(rpc().rpc_sync, peer_name(), has_context, (context_id,))
    return value, mine, callee_has


def call_to_self():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context():
        ret = rpc().rpc_sync(f"worker{ctx.rank}", torch.add, args=(t1, t2))
        found = mod._current_context()
        sends, recvs = found._send_functions(), found._recv_functions()
        return (list(sends), list(recvs), sorted(found._known_worker_ids()),
                ret.grad_fn is list(recvs.values())[-1])


def complex_args():
    mod = autograd()
    t1, t3 = leaves([1.0], [3.0])
    t2 = torch.tensor([2.0])
    t4 = torch.tensor([4.0], requires_grad=True)
    with mod.context():
        rpc().rpc_sync(peer_name(), complex_sum, args=(t1, [t2, (t3, {"k": t4})]))
        found = mod._current_context()
        (send,) = found._send_functions().values()
        return [fn.variable is t for (fn, _), t in zip(send.next_functions, (t1, t3, t4))], len(send.next_functions)


def complex_sum(a, rest):
    t2, (t3, d) = rest
    return a + t2 + t3 + d["k"]


# ---------------------------------------------------------------- clauses
def test_rpc_sync_records_send_and_recv_on_both_sides(rpc_agent):
    """rpc_sync with two grad tensors: one send (next functions: the tensors' AccumulateGrads in order) and one recv (ret.grad_fn) per side, ids paired across workers, callee known."""
    for rank, got in enumerate(rpc_agent.run(sync_builtin_graph)):
        to = (rank + 1) % rpc_agent.world_size
        assert got["send_id"] >> WORKER_BITS == rank and got["recv_id"] >> WORKER_BITS == to, \
            f"rank {rank}: send id {got['send_id']:#x} should come from worker {rank}, recv id {got['recv_id']:#x} " \
            f"from worker {to}"
        assert got["next_vars"] == [True, True] and got["next_nr"] == [0, 0], \
            f"rank {rank}: the send function's next functions are not t1's and t2's AccumulateGrad: {got}"
        assert got["ret_is_recv"], f"rank {rank}: the result's grad_fn is not the recv function"
        (send_name,), (recv_name,) = got["names"]
        assert SEND_NODE_NAME.match(send_name) and RECV_NODE_NAME.match(recv_name), got["names"]
        assert got["known"] == [to], f"rank {rank}: known workers {got['known']}"
        # the callee answered with a grad-requiring result: it reached the caller (known) with its own send
        assert got["callee"] == ([got["recv_id"]], [got["send_id"]], [rank]), \
            f"rank {rank}: the callee's (send ids, recv ids, known) {got['callee']} do not pair with the caller's " \
            f"(send {got['send_id']}, recv {got['recv_id']})"


def test_rpc_async_records_when_the_future_completes(rpc_agent):
    """rpc_async of a Python function: the completed result's grad_fn is the caller's recv function; the callee has one send and one recv."""
    for rank, (sends, recvs, ret_is_recv, callee) in enumerate(rpc_agent.run(async_udf_graph)):
        assert (sends, recvs, ret_is_recv) == (1, 1, True), f"rank {rank}: sends {sends}, recvs {recvs}"
        assert (len(callee[0]), len(callee[1])) == (1, 1), f"rank {rank}: callee (send, recv, known) {callee}"


def test_remote_records_request_and_to_here_response(rpc_agent):
    """remote(): the request's send pairs with the owner's recv; to_here's response adds the owner's send and the caller's recv."""
    for rank, (sends, recvs, callee) in enumerate(rpc_agent.run(remote_then_to_here)):
        assert len(sends) == 1 and len(recvs) == 1, f"rank {rank}: caller sends {sends}, recvs {recvs}"
        callee_sends, callee_recvs, _ = callee
        assert callee_recvs == sends and callee_sends == recvs, \
            f"rank {rank}: owner sends {callee_sends} recvs {callee_recvs}; caller sends {sends} recvs {recvs}"


def test_remote_value_arrives_with_to_here(rpc_agent):
    """Before to_here() the caller has the request's send only; after it one recv, the grad_fn of the fetched value."""
    for rank, (before, after, value_is_recv) in enumerate(rpc_agent.run(remote_before_to_here)):
        assert before == (1, 0) and after == (1, 1) and value_is_recv, \
            f"rank {rank}: (sends, recvs) before to_here {before}, after {after}, value's grad_fn is recv: " \
            f"{value_is_recv}"


def test_builtin_without_grad_tensors_carries_no_context(rpc_agent):
    """A builtin operator on tensors not requiring grad records nothing, reaches no worker and leaves the callee without the context."""
    for rank, (mine, callee_has) in enumerate(rpc_agent.run(builtin_without_grad)):
        assert mine == (0, 0, []), f"rank {rank}: (sends, recvs, known) {mine}"
        assert callee_has is False, f"rank {rank}: the callee has the context"


def test_python_function_always_carries_the_context(rpc_agent):
    """A Python function without tensors records no send/recv but carries the context: the callee is known and has it."""
    for rank, (value, mine, callee_has) in enumerate(rpc_agent.run(udf_without_tensors)):
        assert value == 2 and mine == (0, 0, [(rank + 1) % rpc_agent.world_size]), \
            f"rank {rank}: (sends, recvs, known) {mine}"
        assert callee_has is True, f"rank {rank}: the callee has no context"


def test_call_to_self_records_both_sides_in_one_context(rpc_agent):
    """rpc_sync to self with grad tensors: two sends and two recvs in the caller's context, itself known, the result's grad_fn the response's recv."""
    for rank, (sends, recvs, known, ret_is_recv) in enumerate(rpc_agent.run(call_to_self)):
        assert len(sends) == 2 and len(recvs) == 2 and sorted(sends) == sorted(recvs), \
            f"rank {rank}: sends {sends}, recvs {recvs}"
        assert known == [rank] and ret_is_recv, f"rank {rank}: known {known}, ret is recv {ret_is_recv}"


def test_send_function_inputs_follow_nested_arguments(rpc_agent):
    """Grad tensors nested in lists, tuples and dicts are the send function's inputs in argument order; others are left out."""
    for rank, (same, count) in enumerate(rpc_agent.run(complex_args)):
        assert count == 3 and same == [True, True, True], f"rank {rank}: next functions {same} of {count}"


def remote_builtin_without_grad():
    mod = autograd()
    with mod.context() as context_id:
        rref = rpc().remote(peer_name(), torch.add, args=(torch.ones(2), 1))
        rref._get_future().wait()
        before = _without_context(rpc().rpc_sync, peer_name(), has_context, (context_id,))
        rref.to_here()  # a fetch always carries the context
        after = _without_context(rpc().rpc_sync, peer_name(), has_context, (context_id,))
        found = mod._current_context()
        return before, after, (len(found._send_functions()), len(found._recv_functions()))


def known_workers_without_tensors():
    mod = autograd()
    with mod.context():
        for k in range(1, ctx.world_size):
            rpc().rpc_sync(peer_name(k), constant_len)
        return sorted(mod._current_context()._known_worker_ids())


def test_remote_builtin_without_grad_carries_the_context_only_with_to_here(rpc_agent):
    """remote() of a builtin on tensors not requiring grad leaves the owner without the context; the to_here() fetch brings it; nothing is recorded."""
    for rank, (before, after, recorded) in enumerate(rpc_agent.run(remote_builtin_without_grad)):
        assert (before, after) == (False, True), f"rank {rank}: owner has the context before to_here {before}, " \
                                                 f"after {after}"
        assert recorded == (0, 0), f"rank {rank}: (sends, recvs) {recorded}"


@pytest.mark.min_world_size(3)
def test_every_worker_reached_is_known(rpc_agent):
    """Python functions without tensors called on every other worker inside a context: each of them is a known worker."""
    for rank, known in enumerate(rpc_agent.run(known_workers_without_tensors)):
        want = sorted((rank + k) % rpc_agent.world_size for k in range(1, rpc_agent.world_size))
        assert known == want, f"rank {rank}: known workers {known}, expected {want}"
