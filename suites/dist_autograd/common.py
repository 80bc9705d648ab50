"""What the distributed autograd clauses share: the agent's autograd module, remote functions, helpers.

Remote functions live here (a callee unpickles a function by module and
name). Anything that calls RPC or autograd itself goes through ``rpc()`` /
``autograd()``: the modules of whichever agent this rank runs, so one
function serves every agent.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time

import torch

from backends import rpc_agents
from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.rpc.common import Outcome, outcome_of, peer, peer_name  # noqa: F401  (re-exported for clauses)

WORKER_BITS = 48
CLEANUP_POLL_S = 10.0  # torch's own suite polls clean-up up to 10 s (dist_autograd_test._all_contexts_cleaned_up)
SIMULATED = "Simulate error on backward pass"

# Node names differ by implementation and are not part of the contract: torch's C++ nodes are
# "torch::distributed::autograd::SendRpcBackward", the reference's autograd.Function nodes "SendRpcBackward".
SEND_NODE_NAME = re.compile(r"^(torch::distributed::autograd::)?SendRpcBackward$")
RECV_NODE_NAME = re.compile(r"^(torch::distributed::autograd::)?RecvRpcBackward$")

# torch's texts (/work/shared/specs/dist-autograd.md A4, A5, B2)
ALREADY_HAVE = "Already have an autograd context id for this thread."
NO_CURRENT = "Current thread doesn't have a valid autograd context."
STALE_CURRENT = "Couldn't find autograd context data for current autograd context id"
UNKNOWN = "Could not find autograd context with id: {}"


def rpc():
    return lifecycle.rpc()


def autograd():
    """The torch.distributed.autograd-like module of the agent under test in this rank."""
    return rpc_agents.autograd(lifecycle.current_name())


def unknown_id() -> int:
    """A context id of this worker that is never issued in a test run."""
    return (ctx.rank << WORKER_BITS) | ((1 << WORKER_BITS) - 2)


def leaves(*values, dtype=torch.float32):
    return [torch.tensor(v, dtype=dtype, requires_grad=True) for v in values]


def local_grads(fn, *tensors):
    """The gradients of ``fn(*copies).sum()`` for fresh local copies of ``tensors`` (the oracle)."""
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    out = fn(*copies)
    torch.autograd.backward([out])
    return [c.grad for c in copies]


def first_line(error: str) -> str:
    return error.splitlines()[0] if error else error


# ------------------------------------------------------------ remote functions
def mul(a, b):
    return a * b


def add(a, b):
    return a + b


def times_two_first(a, b):
    """Uses only ``a``: ``b`` travels with requires_grad but gets no gradient."""
    return a * 2


def pair_out(a, b):
    return a * b, a + b


def constant_len():
    return len([1, 2])


def nested_mul(dst: str, a, b):
    """rpc_sync(dst, mul, (a, b)) from the callee, times 2: a chain through a third (or the first) worker."""
    return rpc().rpc_sync(dst, mul, args=(a, b)) * 2


def chain(hops: list, a, b):
    """a*b computed ``len(hops)`` workers deep: each hop calls the next and scales by 3."""
    if not hops:
        return a * b
    return rpc().rpc_sync(hops[0], chain, args=(hops[1:], a, b)) * 3


def context_seen_by_callee():
    """The context id the callee runs in, and whether it may open a context of its own."""
    mod = autograd()
    current = mod._current_context()._context_id()
    try:
        with mod.context():
            pass
        nested = ""
    except RuntimeError as exc:
        nested = str(exc)
    return current, nested


def context_state(context_id: int):
    """On this worker: (send ids, recv ids, known worker ids) of ``context_id``, or None if it has none."""
    mod = autograd()
    try:
        found = mod._retrieve_context(context_id)
    except RuntimeError:
        return None
    return (list(found._send_functions()), list(found._recv_functions()), sorted(found._known_worker_ids()))


def has_context(context_id: int) -> bool:
    try:
        autograd()._retrieve_context(context_id)
    except RuntimeError:
        return False
    return True


def gradients_on_callee(context_id: int, tensor_rref):
    """This worker's context gradient of the owner's value behind ``tensor_rref``, and its ``.grad``."""
    value = tensor_rref.local_value()
    grads = autograd().get_gradients(context_id)
    return grads.get(value), value.grad


def make_weight(values):
    return torch.tensor(values, requires_grad=True)


def mul_by_rref(weight_rref, x):
    """W * x on the owner of W (a leaf that lives there)."""
    return weight_rref.local_value() * x


# ------------------------------------------------------------ autograd functions with effects
class SimulateBackwardError(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise Exception(SIMULATED)


def error_in_backward(x):
    return SimulateBackwardError.apply(x)


def nested_error(dst: str, x):
    return rpc().rpc_sync(dst, error_in_backward, args=(x,)) * 1.0


_SLOW = {"done": threading.Event()}


class SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps, then marks itself done (seen by ``slow_backward_done``)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _mark_stall_began()
        time.sleep(ctx.seconds)
        _SLOW["done"].set()
        return grad * 1.0, None


STALL_BEGAN_KEY = "stall-began/{rank}"


def _mark_stall_began() -> None:
    """Where this worker's slow backward began (CLOCK_MONOTONIC, one clock for every rank on the machine), in the
    case's store: a caller measures its timeout from there (``since_the_stall``)."""
    ctx.store.set(STALL_BEGAN_KEY.format(rank=ctx.rank), repr(time.monotonic()))


def since_the_stall(outcome: Outcome, failed_at: float, stalled_rank: int) -> Outcome:
    """``outcome`` with its seconds counted from when ``stalled_rank``'s slow backward began, where that is later
    than the call's start: a loaded machine that is slow to deliver the backward to the worker does not count
    against the agent (a default run beside CI once measured 4.9 s from the call for a 1.5 s timeout)."""
    key = STALL_BEGAN_KEY.format(rank=stalled_rank)
    if not ctx.store.check([key]):
        return outcome
    began = float(ctx.store.get(key).decode())
    started = failed_at - outcome.seconds
    return dataclasses.replace(outcome, seconds=failed_at - max(started, began))


def slow_identity(x, seconds: float):
    _SLOW["done"].clear()
    return SlowBackward.apply(x, seconds)


def slow_backward_done() -> bool:
    return _SLOW["done"].is_set()


def wait_until(predicate, timeout_s: float = CLEANUP_POLL_S, poll_s: float = 0.01) -> bool:
    end = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(poll_s)


def own_name() -> str:
    return rpc_agents.worker_name(ctx.rank)


def slow_branch_via_self(x, seconds: float):
    """x * 2, plus a call to this worker itself on a leaf of its own whose backward is slow.

    The caller's gradient (through x * 2) is ready at once; this worker's pass
    ends only after the slow branch: a backward that returns before every
    worker's part finished leaves ``slow_backward_done()`` False.
    """
    own = torch.ones_like(x, requires_grad=True)
    side = rpc().rpc_sync(own_name(), slow_identity, args=(own, seconds))
    return x * 2 + side.sum() * 0


def slow_mul(a, b, seconds: float):
    """a * b whose backward on this worker blocks for ``seconds`` (a worker that stops answering mid-backward)."""
    return slow_identity(a, seconds) * b


def plain_ones(n: int):
    """A tensor that does not require grad."""
    return torch.ones(n)


def mul_sum(a, b):
    return (a * b).sum()


def fetch_and_scale(rref, scale: float):
    """On a third worker: the value behind ``rref`` (fetched from its owner inside the caller's context) times scale."""
    return rref.to_here() * scale


def gradient_of_own_leaf(context_id: int) -> list:
    """This worker's context gradients (values only): for a callee whose leaf the caller's loss used."""
    return [g for g in autograd().get_gradients(context_id).values()]


_FAIL = {"on": False}


class FailWhenToldBackward(torch.autograd.Function):
    """Identity whose backward raises while this worker's flag (``set_backward_failure``) is on."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if _FAIL["on"]:
            raise Exception(SIMULATED)
        return grad


def fail_when_told(a, b):
    return FailWhenToldBackward.apply(a * b)


def set_backward_failure(on: bool) -> None:
    _FAIL["on"] = on


def sleep_and_mark(seconds: float, key: str) -> None:
    """Hold one of this worker's request threads, then record in the case store that it is free again."""
    time.sleep(seconds)
    ctx.store.set(key, b"done")
