"""Rank side: profile one workload and return what the clauses check, as plain data.

Runs inside rank processes (``World.run``). Only rank 0 profiles; the other
ranks return None at once and keep serving RPCs from their agent's threads.
Everything returned is picklable: no FunctionEvent crosses the process
boundary.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings

import torch
from torch.autograd import profiler_legacy

from backends import rpc_agents
from suites.profiling.parity import REMOTE_OP
from suites.profiling.workloads import WORKLOADS
from suites.rpc.call_modes import CALLS


def event_record(evt) -> dict:
    return {
        "name": evt.name,
        "node_id": evt.node_id,
        "input_shapes": [list(s) for s in evt.input_shapes] if evt.input_shapes else [],
        "is_remote": bool(evt.is_remote),
        "thread": evt.thread,
        "start_us": float(evt.time_range.start),
        "end_us": float(evt.time_range.end),
        "cpu_memory_usage": int(evt.cpu_memory_usage),
    }


def legacy_profile(**kwargs):
    with warnings.catch_warnings():  # deprecated, and still the only profiler RPC profiling works with
        warnings.simplefilter("ignore")
        return profiler_legacy.profile(**kwargs)


def _rank() -> int:
    """This rank, once every rank of the world has got here: the callees have imported this module, and so
    defined the TorchScript workload (suites/profiling/workloads.py) an RPC names. Without it rank 0's first call
    could reach a callee still unpickling the same case (measured: reference-tp at ws3 under load, 'Unknown
    TorchScript function __torch__.suites.profiling.workloads.script_add_mul: define it (@torch.jit.script) on
    the callee too'; torch requires the function on the callee as well)."""
    import torch.distributed as dist

    from fixtures.rank import ctx

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return ctx.rank


def profile_workload(agent: str, workload: str, rpc_call: str, *, record_shapes: bool = True,
                     profile_memory: bool = False, warmup: int = 0, profiler: str = "legacy",
                     table: bool = False, trace_path: str | None = None):
    """On rank 0: run ``workload`` called the ``rpc_call`` way under a profiler; its events (and table / chrome trace)."""
    if _rank() != 0:
        return None
    api = rpc_agents.api(agent)
    work = WORKLOADS[workload]
    args = work.args(agent)
    for _ in range(warmup):  # first calls compile (TorchScript "defaults") and fill caches
        with legacy_profile(record_shapes=record_shapes, profile_memory=profile_memory):
            work.call(agent, api, rpc_call, args)
    if profiler == "legacy":
        prof = legacy_profile(record_shapes=record_shapes, profile_memory=profile_memory)
        with prof:
            work.call(agent, api, rpc_call, args)
        events = prof.function_events
    elif profiler == "kineto":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=record_shapes, profile_memory=profile_memory) as prof:
            work.call(agent, api, rpc_call, args)
            torch.zeros(1)  # proof the profiler records (the RPC itself may run no op here)
        events = prof.events()
    else:
        raise ValueError(f"unknown profiler {profiler!r}; known: legacy, kineto")
    out = {"events": [event_record(e) for e in events]}
    if table:
        out["table"] = prof.key_averages().table(row_limit=-1)
    if trace_path is not None:
        os.makedirs(os.path.dirname(trace_path) or ".", exist_ok=True)
        prof.export_chrome_trace(trace_path)
        with open(trace_path) as f:
            out["trace"] = json.load(f)
    return out


def profile_locally(workload: str) -> list[dict]:
    """On rank 0: the workload's function run here, under the legacy profiler with shapes."""
    if _rank() != 0:
        return None
    work = WORKLOADS[workload]
    args = work.args("local")
    with legacy_profile(record_shapes=True) as prof:
        work.func(*args)
    return [event_record(e) for e in prof.function_events]


def profile_failing_call(agent: str, rpc_call: str):
    """On rank 0: an RPC that fails on the callee, under the legacy profiler: (error text, events)."""
    if _rank() != 0:
        return None
    api = rpc_agents.api(agent)
    error = None
    # a builtin whose arguments do not broadcast: the request itself fails on the callee
    func, args = torch.add, (torch.ones(2), torch.ones(3))
    with legacy_profile(record_shapes=True) as prof:
        try:
            CALLS[rpc_call].invoke(api, "worker1", func, args)
        except Exception as exc:  # noqa: BLE001 - the error is what the clause checks
            error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "events": [event_record(e) for e in prof.function_events]}


# ----------------------------------------------------- TensorPipe baseline
def start_tensorpipe(init_dir: str, num_worker_threads: int = 16) -> None:
    from fixtures.rank import ctx

    rpc_agents.start_agent("tensorpipe", rank=ctx.rank, world_size=ctx.world_size, store=None,
                           init_file=os.path.join(init_dir, "rendezvous"), num_worker_threads=num_worker_threads)


def stop_tensorpipe() -> None:
    rpc_agents.stop_agent("tensorpipe")


def new_init_dir() -> str:
    return tempfile.mkdtemp(prefix="distconform-profiling-tp-")


def profile_concurrent_calls(agent: str, count: int):
    """On rank 0: ``count`` rpc_async calls of udf_several_ops in flight at once under one legacy profile."""
    if _rank() != 0:
        return None
    from suites.profiling.workloads import udf_several_ops

    api = rpc_agents.api(agent)
    args = [(torch.ones(2, 2),) for _ in range(count)]
    with legacy_profile(record_shapes=True) as prof:
        futures = [api.rpc_async("worker1", udf_several_ops, args=a) for a in args]
        for fut in futures:
            fut.wait()
    return [event_record(e) for e in prof.function_events]


# --------------------------------------------- parity rule 2's measurement
def served_by(x: torch.Tensor) -> int:
    """Callee side of the thread-reuse probe: one op for the profile, and the worker thread that ran it."""
    torch.mul(x, 2)
    return threading.get_native_id()


def profile_thread_reuse(agent: str, calls: int) -> list[dict] | None:
    """On rank 0: ``calls`` profiled rpc_sync calls to worker1, one after another: per call, the thread that
    served it, whether that thread had served an earlier one, and how many callee events came back."""
    if _rank() != 0:
        return None
    api = rpc_agents.api(agent)
    seen: set[int] = set()
    rows = []
    for _ in range(calls):
        with legacy_profile(record_shapes=True) as prof:
            thread = api.rpc_sync("worker1", served_by, args=(torch.ones(2),))
        rows.append({"thread": thread, "reused": thread in seen,
                     "callee_events": sum(1 for e in prof.function_events if REMOTE_OP in e.name)})
        seen.add(thread)
    return rows
