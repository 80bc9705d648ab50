"""Functions and classes the RPC clauses call remotely.

They live in one importable module (never in a test file's closure) because a
callee unpickles a function by its module and name. Anything that calls RPC
itself (async functions, fan-out) goes through ``lifecycle.rpc()``: the API
of whichever agent this rank runs, so one UDF serves every agent.
"""

from __future__ import annotations

import time

import torch
from torch.distributed.rpc.functions import async_execution

from fixtures import rpc_lifecycle as lifecycle


class ExpectedError(ValueError):
    """Raised on purpose by a callee; a clause checks it comes back with this type."""


# ------------------------------------------------------------ plain Python
def add(a, b):
    return a + b


def echo(value):
    return value


def whoami():
    """The callee's own worker name, so a clause can see who really ran the call."""
    return lifecycle.rpc().get_worker_info().name


def add_and_report(a, b):
    return whoami(), a + b


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


RAISABLE = {"ValueError": ValueError, "TypeError": TypeError, "ExpectedError": ExpectedError}


def raise_expected(message, type_name="ExpectedError"):
    raise RAISABLE[type_name](message)


def sleep_then_raise(seconds, message):
    time.sleep(seconds)
    raise ExpectedError(message)


def call_with_kwargs(a, *, scale=1, shift=0):
    return a * scale + shift


# ------------------------------------------------------------ TorchScript
@torch.jit.script
def script_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


# ------------------------------------------------------------ @async_execution
def _plus(step):
    return lambda fut: fut.wait() + step


@async_execution
def async_add_chained(to, x, step, hops):
    """x + step * hops: one RPC to ``to``, then ``hops - 1`` local continuations on its future."""
    fut = lifecycle.rpc().rpc_async(to, torch.add, args=(x, step))
    for _ in range(hops - 1):
        fut = fut.then(_plus(step))
    return fut


@async_execution
def async_add_nested(to, x, step, hops):
    """An async function whose future is another worker's async function's: x + step * (hops + 1)."""
    me = lifecycle.rpc().get_worker_info().name
    return lifecycle.rpc().rpc_async(to, async_add_chained, args=(me, x, step, hops)).then(_plus(step))


@async_execution
def async_fan_out(peers, x):
    """Ask every peer for (its name, x + 1) at once; complete when all answered."""
    futs = [lifecycle.rpc().rpc_async(p, add_and_report, args=(x, 1)) for p in peers]
    return torch.futures.collect_all(futs).then(lambda all_done: [f.wait() for f in all_done.wait()])


@async_execution
def async_returns_tensor(x):
    """Broken on purpose: an async function must return a Future."""
    return x + 1


@async_execution
def async_raises(message):
    """The future it returns completes with an error (``Future.set_exception``)."""
    fut = torch.futures.Future()
    fut.set_exception(ValueError(message))
    return fut


@async_execution
def async_raises_before_returning(message):
    """Raises before it has a future to return."""
    raise ValueError(message)


# ------------------------------------------------------------ RRef targets
class Counter:
    """A stateful object owned by one worker, driven through RRef proxies."""

    def __init__(self, start):
        self.count = start
        self.owner = whoami()

    def add(self, n):
        self.count += n
        return self.count

    def value(self):
        return self.count

    def where(self):
        return self.owner

    def fail(self, message, type_name="ExpectedError"):
        raise_expected(message, type_name)


def rref_seen_by_owner(rref):
    """Run on the owner: what it sees locally (is_owner, local value)."""
    return rref.is_owner(), rref.local_value().value()


def rref_value_via_self(rref, timeout_s):
    """Run on the owner: pass its own RRef to itself in a call to self and read it there (+1)."""
    rpc = lifecycle.rpc()
    return rpc.rpc_sync(rpc.get_worker_info().name, rref_local_plus_one, args=(rref,), timeout=timeout_s)


def rref_local_plus_one(rref):
    return rref.local_value() + 1


def rref_fetch(rref):
    """Run on a third worker: fetch the value through a forked user RRef."""
    return rref.to_here().value(), rref.owner().name, rref.is_owner()


def make_tensor(n, value):
    return torch.full((n,), float(value))


# ------------------------------------------------------------ what arrives (suites/rpc/test_fidelity.py)
def make_linear(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def parameter_facts(value) -> tuple[str, bool, bool]:
    """(class name, requires_grad, is_leaf) of what the callee received."""
    return type(value).__name__, value.requires_grad, value.is_leaf


def strides_of(tensors: list) -> list[tuple[int, ...]]:
    return [tuple(t.stride()) for t in tensors]


def layout_samples(n: int) -> dict[str, torch.Tensor]:
    """Non-row-major tensors, each with its values offset by ``n`` (so caller and callee send different ones)."""
    base = torch.arange(24.0) + n
    return {
        "transpose": (torch.ones(2, 3) + n).t(),
        "permute": base.view(2, 3, 4).permute(2, 0, 1),
        "channels_last": base.view(1, 2, 3, 4).contiguous(memory_format=torch.channels_last),
        "expand": (torch.arange(3.0) + n).expand(2, 3),
    }


def layouts(n: int) -> dict[str, torch.Tensor]:
    """On the callee: its own ``layout_samples(n)`` (suites/rpc/test_fidelity.py's strides clause)."""
    return layout_samples(n)


def call_with(fn, *args):
    """``fn(*args)`` on the callee: ``fn`` arrived over RPC (a bound method, say)."""
    return fn(*args)


def call_and_wait(fn, *args):
    """``fn(*args).wait()`` on the callee: ``fn`` arrived over RPC and returns a future."""
    return fn(*args).wait()


def sorted_keys(mapping: dict) -> list[str]:
    return sorted(mapping)


def rref_confirmed_here(rref):
    """Run on a user that received ``rref`` in this call: is its fork confirmed by the owner, and is this the owner."""
    return rref.confirmed_by_owner(), rref.is_owner()


def device_of(tensor):
    """Where an argument tensor arrived on the callee (the device-map clauses)."""
    return str(tensor.device)
