"""The rank side of the RPC fault clauses: an agent's calls, its graceful shutdown and its first connection under a
network fault, steered by files.

As for the collectives (suites/faults/rank_side.py), the controller (suites/faults/rpc_scenario.py) and the ranks
meet in a folder, never over the network the fault cuts; the agents rendezvous through a file in that folder too
(TensorPipe's ``file://`` init, the reference agents' FileStore), so only the agents' own connections cross the
faulty link, except under a fault of the control plane: there they rendezvous where a user's do, at the world's
store on the switch (``tcp://<switch>:<port>``, every rank a client, as under torchrun's agent store), which the
fault cuts. Each rank calls "across the cut": the ranks beside it call the cut rank, the cut rank calls rank 0.
Every call is timed here and comes back as a plain dict (seconds, value or error type and text).

An agent that starts once per process (TensorPipe) is left running or half shut down: the controller gives each
scenario of such an agent fresh processes. Every wait on a file, and on a shutdown that may never return, is bounded.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from backends import rpc_agents
from fixtures.rank import ctx
from suites.faults import meeting
from suites.faults.rank_side import environment

OPERATIONS = ("rpc_sync", "rpc_async", "remote", "to_here")
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"  # "True": a tcp:// rendezvous joins the store at the address as a client


def across_the_cut(cut: int) -> int:
    """The rank this rank calls: the cut rank, or rank 0 from the cut rank itself."""
    return 0 if ctx.rank == cut else cut


def _start(agent: str, directory: str, timeout_s: float, tag: str, over_the_store: bool):
    """Start ``agent`` as it runs between hosts (rpc_agents.across_hosts), rendezvous through a file in the folder,
    or (``over_the_store``) at the world's store, every rank a client of it (TORCHELASTIC_USE_AGENT_STORE=True, as
    torchrun's workers: rank 0 starts no store of its own)."""
    spec = rpc_agents.across_hosts(rpc_agents.get(agent))
    where: dict[str, str] = {}
    if over_the_store:
        assert ctx.config is not None, "a rank of a world knows its store"
        host, port = ctx.config.store
        where["init_method"] = f"tcp://{host}:{port}"
    with environment({AGENT_STORE_ENV: "True"} if over_the_store else {}):
        spec.start(spec, rank=ctx.rank, world_size=ctx.world_size, store=None,
                   init_file=os.path.join(directory, f"rendezvous-{tag}"), rpc_timeout=timeout_s, num_worker_threads=8,
                   faults=None, devices=(), **where)
    return rpc_agents.api(agent)


def _all_done(directory: str, tag: str) -> None:
    """Every rank is done with its calls (a rank that stops its agent first would reset its peers' later calls)."""
    meeting.mark(directory, f"{tag}{ctx.rank}")
    for rank in range(ctx.world_size):
        meeting.wait(directory, f"{tag}{rank}", f"rank {ctx.rank}")


def _exact(result: torch.Tensor, numel: int) -> float:
    """torch.add(ones, 1) came back whole: 2.0, else the first wrong element or the wrong size (as -numel)."""
    if result.numel() != numel:
        return -float(result.numel())
    wrong = (result != 2).nonzero()
    return 2.0 if wrong.numel() == 0 else float(result[wrong[0, 0]])


def _operations(rpc, peer: str, numel: int, held) -> dict[str, Callable[[], float]]:
    """Each operation of OPERATIONS as a call returning ``_exact`` of its result (every wait the agent's timeout).

    ``remote`` is a remote() made now and fetched; ``to_here`` fetches ``held``, a remote() confirmed before."""
    ones = torch.ones(numel)
    return {
        "rpc_sync": lambda: _exact(rpc.rpc_sync(peer, torch.add, args=(ones, 1)), numel),
        "rpc_async": lambda: _exact(rpc.rpc_async(peer, torch.add, args=(ones, 1)).wait(), numel),
        "remote": lambda: _exact(rpc.remote(peer, torch.add, args=(ones, 1)).to_here(), numel),
        "to_here": lambda: _exact(held.to_here(), numel),
    }


def _all_at_once(operations: dict[str, Callable[[], float]], wait_s: float) -> dict[str, dict]:
    """Every operation timed, all in flight together (one timeout's wait for the lot, not four), each waited for
    at most ``wait_s`` (``returned`` False past it)."""
    outcomes: dict[str, dict] = {name: {} for name in operations}
    threads = {name: threading.Thread(target=lambda n=name, c=call: outcomes[n].update(meeting.timed(c)),
                                      name=f"fault-{name}", daemon=True) for name, call in operations.items()}
    start = time.perf_counter()
    for thread in threads.values():
        thread.start()
    for name, thread in threads.items():
        thread.join(max(0.0, start + wait_s - time.perf_counter()))
        if thread.is_alive():
            outcomes[name] = {"returned": False, "ok": False, "seconds": time.perf_counter() - start}
        else:
            outcomes[name]["returned"] = True
    return outcomes


def calls_under_fault(agent: str, directory: str, timeout_s: float, numel: int, cut: int, wait_s: float,
                      over_the_store: bool) -> dict:
    """Start ``agent`` (RPC timeout ``timeout_s``), connect, then time every operation under the fault and after
    healing, on the same agent; stop it without the handshake (a graceful shutdown has clauses of its own)."""
    rpc = _start(agent, directory, timeout_s, "calls", over_the_store)
    peer = rpc_agents.worker_name(across_the_cut(cut))
    try:
        for other in range(ctx.world_size):  # every connection exists: the fault comes in the middle of a job
            if other != ctx.rank:
                rpc.rpc_sync(rpc_agents.worker_name(other), torch.add, args=(torch.ones(1), 1))
        held = rpc.remote(peer, torch.add, args=(torch.ones(numel), 1))
        held.to_here()
        meeting.mark(directory, f"ready{ctx.rank}")
        meeting.wait(directory, "go", f"rank {ctx.rank}")
        under = _all_at_once(_operations(rpc, peer, numel, held), wait_s)
        meeting.mark(directory, f"faulted{ctx.rank}")
        meeting.wait(directory, "healed", f"rank {ctx.rank}")
        after = {name: _bounded(call, wait_s) for name, call in _operations(rpc, peer, numel, held).items()}
        _all_done(directory, "done")
    finally:
        try:
            rpc.shutdown(graceful=False)
        except Exception:  # a dead pipe may refuse; the agent is abandoned either way
            pass
    return {"under": under, "after": after}


def _bounded(call: Callable[[], Any], wait_s: float) -> dict:
    """``meeting.timed(call)`` on a thread of its own, given up after ``wait_s``: ``returned`` False when it never came back
    (its thread is left behind; the controller then kills the process)."""
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(meeting.timed(call)), name="bounded-call", daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        return {"returned": False, "ok": False, "seconds": time.perf_counter() - start}
    return {"returned": True, **outcome}


def shutdown_under_fault(agent: str, directory: str, timeout_s: float, shutdown_timeout_s: float, cut: int,
                         wait_s: float, over_the_store: bool) -> dict:
    """Start ``agent``, connect, then under the fault make one call across the cut and at once call
    ``shutdown(graceful=True, timeout=shutdown_timeout_s)`` on every rank, waiting at most ``wait_s`` for it."""
    rpc = _start(agent, directory, timeout_s, "shutdown", over_the_store)
    for other in range(ctx.world_size):
        if other != ctx.rank:
            rpc.rpc_sync(rpc_agents.worker_name(other), torch.add, args=(torch.ones(1), 1))
    meeting.mark(directory, f"ready{ctx.rank}")
    meeting.wait(directory, "go", f"rank {ctx.rank}")
    # work in flight across the cut: a graceful shutdown must wait for it, and it can never complete
    rpc.rpc_async(rpc_agents.worker_name(across_the_cut(cut)), torch.add, args=(torch.ones(1), 1))
    outcome = _bounded(lambda: rpc.shutdown(graceful=True, timeout=shutdown_timeout_s), wait_s)
    meeting.mark(directory, f"faulted{ctx.rank}")
    return outcome


def connect_under_fault(agent: str, directory: str, timeout_s: float, numel: int, cut: int, wait_s: float,
                        over_the_store: bool) -> dict:
    """The fault is in place before the agent exists: time its start and the first call across the cut, each
    waited for at most ``wait_s``."""
    meeting.mark(directory, f"ready{ctx.rank}")
    meeting.wait(directory, "go", f"rank {ctx.rank}")
    made: list = []
    started = _bounded(lambda: made.append(_start(agent, directory, timeout_s, "connect", over_the_store)), wait_s)
    first = None
    if started["ok"]:
        peer = rpc_agents.worker_name(across_the_cut(cut))
        first = _bounded(lambda: _exact(made[0].rpc_sync(peer, torch.add, args=(torch.ones(numel), 1)), numel),
                         wait_s)
    meeting.mark(directory, f"faulted{ctx.rank}")
    return {"start": started, "first_call": first}
