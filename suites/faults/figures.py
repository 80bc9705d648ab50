"""The figures of a fault scenario: per operation, how long each rank took and how its call ended.

Every scenario (a collective's, suites/faults/scenario.py; an RPC agent's, rpc_scenario.py) becomes one figure
per operation it timed under the fault, recorded on each case that reads it as the user property
``fault_figure`` (reports/fault_figures.py: summary.md's and report.html's Faults section, conformance.json). A
rank whose wait was given up counts as raising after it: "did not return".
"""

from __future__ import annotations

from backends import rpc_agents
from reports.fault_figures import encode

NOT_RETURNED = "did not return"


def _end(rank: int, outcome: dict | None) -> dict | None:
    if outcome is None:
        return None
    if not outcome.get("returned", True) or outcome.get("stuck"):
        return {"rank": rank, "seconds": outcome["seconds"], "ok": False,
                "error": f"{NOT_RETURNED} within {outcome['seconds']:.1f} s"}
    error = f"{outcome.get('type', 'Error')}: {outcome.get('error', '')}" if not outcome["ok"] else ""
    return {"rank": rank, "seconds": outcome["seconds"], "ok": bool(outcome["ok"]), "error": error}


def _figure(fault: str, target: str, world_size: int, operation: str, timeout_s: float, ends: list) -> dict | None:
    """None when no rank got as far as this operation (a first call after a start that never returned)."""
    ran = [e for e in ends if e is not None]
    return encode(fault, target, world_size, operation, timeout_s, ran) if ran else None


def collective_figures(scenario, backend: str) -> list[dict | None]:
    """A collective scenario's operations under the fault (all_reduce, barrier, p2p, store_get, abort, destroy; the
    first all_reduce before the first connection), per rank that takes part."""
    size = len(scenario.ranks)
    if scenario.when == "before_connect":
        named = {"all_reduce": "first all_reduce (lazy init)"}
    else:
        named = {op: op.replace("_", " ") for op in ("all_reduce", "barrier", "p2p", "store_get")}
        named.update(abort="abort (all_reduce pending)", destroy="destroy_process_group (all_reduce pending)")
    return [_figure(scenario.fault, backend, size, label, scenario.timeout_s,
                    [_end(rank, outcome) for rank, outcome in scenario.outcomes(op).items()])
            for op, label in named.items()]


def rpc_target(agent: str, backend: str) -> str:
    """How the report names an agent: with the c10d backend its messages cross, for an agent that uses one (the
    same agent over two backends is two rows)."""
    return f"{agent} over {backend}" if rpc_agents.get(agent).uses_backend else agent


def rpc_figures(scenario, timeout_s: float, backend: str) -> list[dict | None]:
    """An RPC scenario's operations: each call under the fault, graceful shutdown, or the start and first call."""
    size = len(scenario.ranks)
    target = rpc_target(scenario.agent, backend)
    if scenario.kind == "calls":  # a stopped (frozen) rank's calls ran once it was let go: not under the fault
        operations = sorted({op for out in scenario.ranks for op in out["under"]})
        return [_figure(scenario.fault, target, size, op, timeout_s,
                        [_end(rank, out["under"].get(op)) for rank, out in enumerate(scenario.ranks)
                         if rank not in scenario.stopped])
                for op in operations]
    if scenario.kind == "shutdown":
        return [_figure(scenario.fault, target, size, "graceful shutdown", timeout_s,
                        [_end(rank, out) for rank, out in enumerate(scenario.ranks)])]
    return [_figure(scenario.fault, target, size, step.replace("_", " ") if step != "start" else "init_rpc",
                    timeout_s, [_end(rank, out.get(step)) for rank, out in enumerate(scenario.ranks)])
            for step in ("start", "first_call")]


def record(request, figures: list[dict | None]) -> None:
    """Put the figures on the case reading the scenario (the report keeps one per operation)."""
    for figure in figures:
        if figure is not None:
            request.node.user_properties.append(("fault_figure", figure))
