"""The controller side of the RPC fault clauses: an agent's calls, graceful shutdown or first connection under a
fault of the table.

As suites/faults/scenario.py does for a collective: the ranks' side (suites/faults/rpc_rank_side.py) runs with
``World.run`` while a thread of the controller waits for every rank's ``ready``, injects the fault on the last
rank's host, writes ``go``, waits for the ranks that can answer to write ``faulted``, heals and writes ``healed``.
Healing happens whatever goes wrong. Three kinds of scenario:

- ``calls``: the agent is connected, then rpc_sync, rpc_async, remote and to_here run under the fault and again
  after healing;
- ``shutdown``: the agent is connected, then every rank calls ``shutdown(graceful=True, timeout=TIMEOUT_S)``
  under the fault;
- ``connect``: the fault is in place before the agent starts; its start and its first call across the cut.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

from fixtures.world import World
from suites.faults import meeting
from suites.faults import rpc_rank_side
# The agent's RPC timeout under a fault (graceful shutdown's too) is the collectives' group timeout: TIMEOUT_S, 2 s,
# under a breaking fault; under a negative control room for a lossy link's retransmissions, which the calls must
# fit. The slack a bounded wait may take is theirs too, and a call moves enough for a cut after N bytes to bite.
from suites.faults.scenario import SLACK_S, payload, timeout_for
from suites.faults.table import TABLE, Fault, Target

# 32 KiB of float32 per call: at 3 ranks the cut host's link carries 12 such calls at once each way (every
# operation of its two callers and its own), 384 KiB, about 0.4 s at the slow link's 8 Mbit/s
NUMEL = 8 * 1024
KINDS = ("calls", "shutdown", "connect")


def give_up_after(fault: Fault) -> float:
    """A rank stops waiting for a call after this (the clause then fails)."""
    return timeout_for(fault) + SLACK_S + 2.0


@dataclass(frozen=True)
class RpcScenario:
    """What every rank saw in one scenario: ``ranks[r]`` is rpc_rank_side's result of rank r."""

    agent: str
    fault: str
    kind: str
    timeout_s: float  # the agent's RPC timeout (and graceful shutdown's) in this scenario
    cut_rank: int
    ranks: tuple[dict, ...]
    missing: tuple[str, ...]  # what the controller did not see within its bound, in words

    @property
    def stopped(self) -> tuple[int, ...]:
        """The ranks whose process the fault stopped (frozen): their calls "under the fault" ran once it healed."""
        return (self.cut_rank,) if TABLE[self.fault].stops_the_rank else ()

    @property
    def clean(self) -> bool:
        """Every wait of every rank returned: its processes hold no call, shutdown or start still running."""
        return not self.missing and all(outcome.get("returned", True) for rank in self.ranks
                                        for outcome in _outcomes(rank))


def _outcomes(rank: dict) -> list[dict]:
    found = []
    for value in rank.values():
        if isinstance(value, dict) and "seconds" in value:
            found.append(value)
        elif isinstance(value, dict):
            found.extend(_outcomes(value))
    return found



def run_rpc_scenario(world: World, agent: str, fault: Fault, kind: str, deadline: float = 90.0) -> RpcScenario:
    if kind not in KINDS:
        raise ValueError(f"scenario kind must be one of {', '.join(KINDS)}, not {kind!r}")
    hosts = world.hosts
    assert hosts is not None and world.store is not None, "a fault needs a world on simulated hosts"
    cut = world.world_size - 1
    target = Target(hosts, cut, world.pid_of(cut), int(world.store.port))
    directory = tempfile.mkdtemp(prefix=f"distconform-rpc-fault-{agent}-{kind}-{fault.name}-")
    stop = threading.Event()
    missing: list[str] = []

    timeout, numel, give_up = timeout_for(fault), payload(fault, NUMEL), give_up_after(fault)
    # the agents meet at the world's store (on the switch) only where the fault is on the control plane: elsewhere
    # through a file, so that only their own connections cross the faulty link
    over_the_store = fault.plane == "control"
    call: Callable[..., dict]
    args: tuple
    if kind == "calls":
        call, args = rpc_rank_side.calls_under_fault, (agent, directory, timeout, numel, cut, give_up, over_the_store)
    elif kind == "shutdown":
        call, args = rpc_rank_side.shutdown_under_fault, (agent, directory, timeout, timeout, cut, give_up,
                                                           over_the_store)
    else:
        call, args = rpc_rank_side.connect_under_fault, (agent, directory, timeout, numel, cut, give_up,
                                                          over_the_store)
    thread = threading.Thread(target=meeting.control,
                              args=(directory, world.world_size, cut, fault, target, hosts, stop, missing,
                                    "under the fault"), name=f"rpc-fault-{fault.name}", daemon=True)
    thread.start()
    try:
        results = world.run(call, *args, deadline=deadline)
    finally:
        stop.set()
        thread.join()
        shutil.rmtree(directory, ignore_errors=True)
    return RpcScenario(agent, fault.name, kind, timeout, cut, tuple(results), tuple(missing))
