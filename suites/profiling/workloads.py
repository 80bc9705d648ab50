"""The profiling parity workloads: RPCs a user profiles, the same for every agent.

Each workload is one caller-side function run on rank 0 (``worker0``) under
the legacy profiler; ``api`` is the agent's torch.distributed.rpc-like module
(backends/rpc_agents.api). The functions the callee runs are module-level
here, so every agent (and TensorPipe's pickler) can find them by name, and
the ones that call onward take the agent's name, because the callee must
use the same agent for its own RPCs.

A workload is called the ways of suites/rpc/call_modes.py's table (``MODES``:
rpc_sync, rpc_async + wait, remote + to_here), named in clauses by the
requirement ``rpc_call`` and shown in case ids and the parity table by torch's
exec mode (``sync``, ``async``, ``remote``: what the RPC's event is named after).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.distributed.rpc.functions import async_execution

from backends import rpc_agents
from suites.rpc.call_modes import CALLS, REMOTE, RPC_ASYNC, RPC_SYNC, CallMode


# ---------------------------------------------------------------- callee side
def udf_several_ops(x):
    """A Python function doing several ops on the callee."""
    y = torch.add(x, 1)
    z = torch.mul(y, y)
    return torch.relu(z - 3)


@torch.jit.script
def script_add_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.mul(torch.add(x, y), 2)


def udf_raises(x):
    """Does an op, then raises: the exception is the request's value on the callee (torch's
    internal._run_function), so the caller gets the error *and* the callee's events."""
    torch.add(x, 1)
    raise ValueError("udf_raises raises on purpose")


def slow_add(x, y):
    """The innermost function of the nested workload (runs on worker2)."""
    return torch.add(x, y)


@async_execution
def async_add(agent, to, x, y):
    """Runs on worker1: forwards to ``to`` and answers when that answers (@async_execution)."""
    api = rpc_agents.api(agent)
    return api.rpc_async(to, slow_add, args=(x, y)).then(lambda fut: fut.wait() + 1)


# ---------------------------------------------------------------- caller side
def _rpc_profiled() -> bool:
    """torch.distributed.rpc.api._get_should_profile: the legacy profiler is on in this thread."""
    return (torch.autograd._profiler_enabled()
            and torch._C._autograd._profiler_type() == torch._C._profiler.ActiveProfilerType.LEGACY)


def _call(api, mode: CallMode, to, func, args):
    returned = mode.call(api, to, func, args)
    if mode.wait_method != "to_here":
        return mode.wait(returned)
    # An RRef: the RPC's profiling record ends when the owner confirms the RRef, which
    # may come after to_here() returns, or raises; wait for it (as torch's
    # rpc_test does), or the record would still be open when the profiler stops
    # (measured: TensorPipe lost every event of a raising remote() in 3 of 12
    # profiles when only a successful to_here() waited).
    # (torch's RRef keeps that future apart; an agent without the method hands
    # out the profiled creation future from _get_future)
    rref = returned
    profiled = getattr(rref, "_get_profiling_future", None) if _rpc_profiled() else None
    confirmed = profiled() if profiled is not None else rref._get_future()
    try:
        value = mode.wait(rref)
    except Exception:
        try:
            confirmed.wait()
        except Exception:  # noqa: BLE001 - the creation carries the same error; to_here's is the one reported
            pass
        raise
    confirmed.wait()
    return value


@dataclass(frozen=True)
class Workload:
    """One RPC: ``func(*args(agent))`` on worker ``dst``, called the way a call mode says."""

    name: str
    dst: int
    func: Callable
    args: Callable  # agent name -> the call's arguments (made before profiling starts)
    min_world_size: int = 2
    description: str = ""

    raises: bool = False  # the call fails: its error is the result
    # Call modes (rpc_call names) in which TensorPipe's callee may lose this call's events (parity.py, rule 2: its
    # continuation races the request thread's profiler clean-up; measured by suites/profiling/measure.py).
    callee_events_race: frozenset = frozenset()

    def races(self, rpc_call: str) -> bool:
        return rpc_call in self.callee_events_race

    def call(self, agent: str, api, rpc_call: str, args: tuple):
        try:
            return _call(api, CALLS[rpc_call], rpc_agents.worker_name(self.dst), self.func, args)
        except Exception as exc:  # noqa: BLE001 - only for workloads that fail on purpose
            if not self.raises:
                raise
            return exc


MODES = tuple(mode.name for mode in (RPC_SYNC, RPC_ASYNC, REMOTE))  # rpc_call values; ids: call_modes.exec_mode_of

WORKLOADS = {w.name: w for w in (
    Workload("builtin_add", 1, torch.add, lambda agent: (torch.ones(3), 1), description="torch.add on worker1"),
    Workload("builtin_mul", 1, torch.mul, lambda agent: (torch.ones(2, 3), torch.ones(2, 3)),
             description="torch.mul on worker1"),
    Workload("python_udf", 1, udf_several_ops, lambda agent: (torch.ones(2, 2),),
             description="a Python function doing several ops on worker1"),
    Workload("torchscript", 1, script_add_mul, lambda agent: (torch.ones(3), torch.ones(3)),
             description="a TorchScript function on worker1"),
    Workload("nested_async", 1, async_add, lambda agent: (agent, "worker2", torch.ones(2), torch.ones(2)),
             min_world_size=3, callee_events_race=frozenset({REMOTE.name}),
             description="an @async_execution function on worker1 that calls worker2"),
    Workload("call_self", 0, torch.add, lambda agent: (torch.ones(3), 1), description="torch.add on the caller itself"),
    Workload("python_udf_raises", 1, udf_raises, lambda agent: (torch.ones(2),), raises=True,
             callee_events_race=frozenset(MODES),
             description="a Python function on worker1 that does an op and raises"),
)}

# What an agent knowingly does differently is one of its gaps (backends/rpc_agents.py),
# matched on ``workload=`` (and ``rpc_call=``): the clauses state them as requirements.
CONCURRENT = "concurrent_calls"  # the workload name of test_concurrent_calls_each_bring_their_own_events


def known_deviation(agent: str, workload: str, rpc_call: str | None = None) -> str:
    """The reason of the agent's gap for this workload ("" if it is held to TensorPipe's events)."""
    gap = rpc_agents.get(agent).gap_for(workload=workload, rpc_call=rpc_call)
    return gap.reason if gap else ""


NESTED = "nested_async"  # the workload whose chrome trace goes to the report
