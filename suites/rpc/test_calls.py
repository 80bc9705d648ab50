"""Contract: rpc_sync, rpc_async and remote run a function on the named worker and return its result.

Builtin operators (torch.add), Python functions and TorchScript functions are
called the same three ways; positional and keyword arguments arrive as
given; tensors come back bit-exact in dtype, shape and value whatever their
dtype or layout; a worker may call itself; many calls in flight at once from
every worker to every worker each get their own reply (every reply names the
worker that computed it and carries the caller's own value).
"""

import pytest
import torch

from backends.rpc_agents import worker_name
from fixtures.rank import ctx
from fixtures import rpc_lifecycle as lifecycle
from suites.rpc import udfs
from suites.rpc.call_modes import CALLS, FUNCTION_CALLS
from suites.rpc.common import barrier, peer_name

IN_FLIGHT = 16  # calls each worker has outstanding to each worker in the concurrency clause


FUNCTIONS = {
    # kind -> (function, args from the caller's rank, expected result)
    "builtin": (torch.add, lambda r: (torch.arange(4.0), r), lambda r: torch.arange(4.0) + r),
    "python": (udfs.add, lambda r: (torch.arange(4.0), r), lambda r: torch.arange(4.0) + r),
    "torchscript": (udfs.script_add, lambda r: (torch.arange(4.0), torch.full((4,), float(r))),
                    lambda r: torch.arange(4.0) + r),
}


# ---------------------------------------------------------------- rank side
def call_next(rpc_call, kind):
    func, args, _ = FUNCTIONS[kind]
    return CALLS[rpc_call].invoke(lifecycle.rpc(), peer_name(), func, args(ctx.rank))


def call_self(rpc_call):
    return CALLS[rpc_call].invoke(lifecycle.rpc(), worker_name(ctx.rank), udfs.add_and_report,
                                  (torch.ones(3), ctx.rank))


def call_with_kwargs(rpc_call):
    return CALLS[rpc_call].invoke(lifecycle.rpc(), peer_name(), udfs.call_with_kwargs, (torch.ones(2) * ctx.rank,),
                                  {"scale": 3, "shift": 7})


def echo_tensors(tensors):
    rpc = lifecycle.rpc()
    return [rpc.rpc_sync(peer_name(), udfs.echo, args=(t,)) for t in tensors]


def everyone_calls_everyone(count):
    rpc = lifecycle.rpc()
    # Every worker has heard from every other before the burst, so the burst meets an agent past its first contact
    # wherever the scheduler puts the peers' first requests (an agent that answers "the last caller" is right until a
    # peer has called it: without this round its self-calls could all be answered first, and correctly).
    for dst in range(ctx.world_size):
        if dst != ctx.rank:
            rpc.rpc_sync(worker_name(dst), udfs.add_and_report, args=(ctx.rank * 1000, -1))
    barrier("everyone_calls_everyone")
    futs = {(dst, i): rpc.rpc_async(worker_name(dst), udfs.add_and_report, args=(ctx.rank * 1000, i))
            for i in range(count) for dst in range(ctx.world_size)}
    return {key: fut.wait() for key, fut in futs.items()}


def sample_tensors():
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    return {
        "float32": torch.linspace(-3, 3, 7),
        "float64": base.clone(),
        "int64": torch.tensor([-(2 ** 62), -1, 0, 1, 2 ** 62]),
        "bool": torch.tensor([True, False, True]),
        "bfloat16": torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16),
        "strided_view": base[:, ::2],
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5),
    }


# ---------------------------------------------------------------- clauses
def _torchscript(kind):
    return [pytest.mark.needs(rpc_feature="torchscript")] if kind == "torchscript" else []


@pytest.mark.parametrize("kind", [pytest.param(k, marks=_torchscript(k)) for k in FUNCTIONS])
@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_call_runs_function_on_peer(rpc_agent, rpc_call, kind):
    """rpc_sync / rpc_async / remote of a builtin, Python or TorchScript function return its exact result."""
    results = rpc_agent.run(call_next, rpc_call, kind)
    expected = FUNCTIONS[kind][2]
    for rank, got in enumerate(results):
        assert torch.equal(got, expected(rank)), \
            f"{rpc_call} {kind} from rank {rank}: got {got}, expected {expected(rank)}"


@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_call_to_self(rpc_agent, rpc_call):
    """A worker calling itself by its own name runs the function locally and gets the result."""
    for rank, (where, value) in enumerate(rpc_agent.run(call_self, rpc_call)):
        assert where == worker_name(rank), f"{rpc_call} to self from rank {rank} ran on {where}"
        assert torch.equal(value, torch.ones(3) + rank)


@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_keyword_arguments_arrive(rpc_agent, rpc_call):
    """Keyword arguments reach the remote function by name (a * scale + shift)."""
    for rank, got in enumerate(rpc_agent.run(call_with_kwargs, rpc_call)):
        assert torch.equal(got, torch.ones(2) * rank * 3 + 7), f"rank {rank}: {got}"


def test_tensors_round_trip_exactly(rpc_agent):
    """Tensors of every dtype and layout (strided view, empty, 0-d) come back with the same dtype, shape, values."""
    sent = sample_tensors()
    results = rpc_agent.run(echo_tensors, list(sent.values()))
    for rank, echoed in enumerate(results):
        for (name, original), got in zip(sent.items(), echoed):
            assert got.dtype == original.dtype and got.shape == original.shape, \
                f"rank {rank} {name}: got {got.dtype} {tuple(got.shape)}, sent {original.dtype} {tuple(original.shape)}"
            assert torch.equal(got, original), f"rank {rank} {name}: got {got}, sent {original}"


def test_concurrent_calls_each_get_their_own_reply(rpc_agent):
    """Many calls in flight from every worker to every worker: each reply comes from the callee asked, with the caller's value.

    Every worker first calls each other once and waits for all to have done so: the burst then meets agents that
    have been called (the seeded rpc_reply_wrong_caller answers the last remote caller, so before any remote call
    its self-calls were answered right, and whether the burst's self-calls came first was the scheduler's choice)."""
    for rank, replies in enumerate(rpc_agent.run(everyone_calls_everyone, IN_FLIGHT)):
        for (dst, i), (where, value) in sorted(replies.items()):
            assert (where, value) == (worker_name(dst), rank * 1000 + i), \
                f"rank {rank}'s call #{i} to {worker_name(dst)} got ({where}, {value}), " \
                f"expected ({worker_name(dst)}, {rank * 1000 + i})"
