"""What every rank runs for the RPC stress benchmark (module-level, so World.run can send it).

A run of suites/stress/rpc.py calls, on every rank of a live World:
``start`` (the agent comes up as worker{rank}), ``measure`` once per
(benchmark, mode, profiled), then ``stop``. As in torch's
test_stress_light_rpc every rank calls worker (rank + 1) % world_size, so
each rank is caller and callee at once.

``measure`` warms up with ``warmup`` synchronous calls, waits at a barrier
(ranks overlap, as in torch's test), then times either

* ``async``: ``calls`` rpc_async issued back to back, then
  torch.futures.wait_all; the burst's time is the figure (torch's own test);
* ``sync``: ``calls`` rpc_sync one after the other, each timed with
  perf_counter_ns, for the latency percentiles.

Every answer must be 0 (the UDFs' contract); the others are counted as wrong.
With ``profiled`` the timed part runs inside torch.autograd.profiler_legacy.profile
and the result says how many events it recorded and how many came from the
callee (remote profiling: TensorPipe sends them back with the answer).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from backends import rpc_agents
from fixtures.rank import ctx, on_before_pg_destroy
from suites.rpc.call_modes import by_exec_mode
from suites.stress import rpc_udfs

HEAVY_SHAPE = (100, 100)  # torch's test_stress_heavy_rpc argument
_AGENT_KEY = "rpc_stress_agent"


def start(agent: str, init_file: str, rpc_timeout: float, num_worker_threads: int) -> str:
    """Start ``agent`` as worker{rank}; every rank gets the same store and init file."""
    on_before_pg_destroy(_stop_before_pg_destroy)
    rpc_udfs.arm_stalls()
    rpc_agents.start_agent(agent, rank=ctx.rank, world_size=ctx.world_size, store=ctx.store,
                           init_file=init_file, rpc_timeout=rpc_timeout, num_worker_threads=num_worker_threads)
    ctx.scratch[_AGENT_KEY] = agent
    return rpc_agents.worker_name(ctx.rank)


def stop(agent: str, graceful: bool = True) -> bool:
    """Stop the agent; stalled test calls are released first so no worker thread holds the shutdown."""
    rpc_udfs.release_stalls()
    ctx.scratch.pop(_AGENT_KEY, None)
    rpc_agents.stop_agent(agent, graceful=graceful)
    return True


def _stop_before_pg_destroy() -> None:
    """A world reset (after a failed measurement) or shutdown must not leave an agent running."""
    agent = ctx.scratch.get(_AGENT_KEY)
    if agent is not None:
        stop(agent, graceful=False)


def _profiler(profiled: bool):
    if not profiled:
        return contextlib.nullcontext(None)
    from torch.autograd import profiler_legacy

    return profiler_legacy.profile()


def _profile_summary(prof, exit_seconds: float) -> dict:
    """How much the profiler recorded: all events, the RPC records, the callee's (remote) events."""
    events = prof.function_events
    own = {-1, ctx.rank}
    remote = sum(1 for e in events if getattr(e, "node_id", -1) not in own)
    # the caller's own records of its RPCs (remote events are named after them too, with "#remote_op: ...")
    rpc_records = sum(1 for e in events if e.name.startswith(("rpc_async#", "rpc_sync#"))
                      and getattr(e, "node_id", -1) in own)
    return {"events": len(events), "rpc_records": rpc_records, "remote_events": remote,
            "exit_seconds": exit_seconds}


def measure(agent: str, benchmark: str, mode: str, *, calls: int, warmup: int, profiled: bool = False,
            udf: str | None = None) -> dict:
    """Time ``calls`` RPCs of ``benchmark`` ("light" or "heavy") in ``mode`` ("async" or "sync": torch's exec mode
    of a call mode of suites/rpc/call_modes.py)."""
    call_mode = by_exec_mode(mode)
    rpc = rpc_agents.api(agent)
    send = getattr(rpc, call_mode.api)  # looked up once: the loop times the RPC, not the lookup
    dst = rpc_agents.worker_name((ctx.rank + 1) % ctx.world_size)
    func = rpc_udfs.UDFS[udf or benchmark]
    args = (torch.ones(HEAVY_SHAPE),) if benchmark == "heavy" else ()

    warm_values = [rpc.rpc_sync(dst, func, args=args) for _ in range(warmup)]
    samples_ns = None
    dist.barrier()
    with _profiler(profiled) as prof:
        if not call_mode.blocking:  # a burst of calls, then wait for them all: the burst's time is the figure
            started = time.perf_counter_ns()
            handles = [send(dst, func, args=args) for _ in range(calls)]
            values = call_mode.wait_all(handles)
            elapsed_ns = time.perf_counter_ns() - started
        else:  # one call after the other, each timed, for the latency percentiles
            samples_ns, values = [], []
            clock = time.perf_counter_ns
            started = clock()
            for _ in range(calls):
                before = clock()
                values.append(send(dst, func, args=args))
                samples_ns.append(clock() - before)
            elapsed_ns = clock() - started
        exit_started = time.perf_counter()
    profile = _profile_summary(prof, time.perf_counter() - exit_started) if profiled else None
    wrong = sum(1 for v in warm_values + values if v != 0)
    return {"rank": ctx.rank, "seconds": elapsed_ns / 1e9, "calls": calls, "warmup": warmup,
            "samples_ns": samples_ns, "wrong": wrong, "profile": profile}
