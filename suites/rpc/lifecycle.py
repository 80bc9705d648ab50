"""Rank side of the RPC agent lifecycle: one shared agent per (world, agent), private ones on demand.

Starting an agent costs about a second (TensorPipe), so every rank keeps the
agent of the last test running and the next test of the same agent reuses it
(``ensure_shared``, called by the ``rpc_agent`` fixture before each test). A
clause that needs its own configuration (fault injection, a short default
timeout) or that shuts the agent down runs inside ``private_agent``: the
shared agent is stopped first and nothing is left running afterwards, so the
next test starts the shared one again.

Every start is collective: all ranks must start the same agent with the same
store prefix and the same TensorPipe init file. The prefix is derived from
the case id (equal on all ranks for one ``World.run``) and a per-case start
counter; the init file lives in a temp dir rank 0 creates and publishes
through the store.

Before the harness destroys the default process group (re-initialisation
after a failure, world exit) the running agent is stopped without the
graceful handshake: the reference-pg agent sends over that group, and a peer
that already failed would never answer a handshake.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch.distributed as dist

from backends import rpc_agents
from fixtures.rank import ctx

STORE_WAIT_S = 30.0


@dataclass
class Running:
    name: str
    key: str  # the store prefix of this start: names the start on every rank
    shared: bool
    tmpdir: str | None = None


@dataclass
class _State:
    running: Running | None = None
    case_id: int = -1
    starts_in_case: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()


def current_name() -> str:
    if _STATE.running is None:
        raise RuntimeError("no RPC agent is running in this rank (the rpc_agent fixture starts one)")
    return _STATE.running.name


def rpc():
    """The torch.distributed.rpc-like module of the agent running in this rank."""
    return rpc_agents.api(current_name())


def _next_key() -> str:
    if _STATE.case_id != ctx.case_id:
        _STATE.case_id, _STATE.starts_in_case = ctx.case_id, 0
    _STATE.starts_in_case += 1
    return f"rpc-agent/case{ctx.case_id}/start{_STATE.starts_in_case}"


def _start(name: str, *, shared: bool, **options) -> Running:
    key = _next_key()
    store = dist.PrefixStore(key, ctx.base_store)
    store.set_timeout(_timedelta(STORE_WAIT_S))
    tmpdir = None
    if ctx.rank == 0:
        tmpdir = tempfile.mkdtemp(prefix="distconform-rpc-")
        store.set("init_dir", tmpdir)
    init_dir = store.get("init_dir").decode()
    running = Running(name, key, shared, tmpdir)
    rpc_agents.start_agent(name, rank=ctx.rank, world_size=ctx.world_size, store=dist.PrefixStore("agent", store),
                           init_file=os.path.join(init_dir, "rendezvous"), **options)
    _STATE.running = running
    return running


def _timedelta(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def stop(graceful: bool = True) -> None:
    """Stop this rank's agent, if any; the state is cleared even if shutdown raises."""
    running, _STATE.running = _STATE.running, None
    if running is None:
        return
    try:
        rpc_agents.stop_agent(running.name, graceful=graceful)
    finally:
        if running.tmpdir:
            shutil.rmtree(running.tmpdir, ignore_errors=True)


def stop_quietly() -> None:
    """For the harness's hooks: never raise, never wait for peers."""
    try:
        stop(graceful=False)
    except Exception:
        pass


def ensure_shared(name: str, restart: bool = False) -> dict:
    """Make the shared agent ``name`` run on every rank; reuse it when every rank already has it.

    Ranks first agree through the case store on what they run: a start is
    collective, so one rank reusing while another restarts would hang both.
    """
    mine = _STATE.running
    state = f"{mine.name}|{mine.key}" if (mine is not None and mine.shared and not restart) else "-"
    ctx.store.set(f"agent_state/{ctx.rank}", state)
    states = {ctx.store.get(f"agent_state/{r}").decode() for r in range(ctx.world_size)}
    if states == {state} and state != "-" and mine.name == name:
        return {"started": False, "key": mine.key}
    stop_quietly()
    running = _start(name, shared=True)
    return {"started": True, "key": running.key}


@contextmanager
def private_agent(**options):
    """Run a clause on an agent of its own (same agent kind as the shared one).

    ``options`` go to ``start_agent`` (``faults=``, ``rpc_timeout=``). On exit
    the private agent is shut down gracefully unless the body already did,
    and no agent is left running: the next test starts the shared one again.
    """
    name = current_name()
    stop(graceful=True)  # collective: every rank runs the same clause
    _start(name, shared=False, **options)
    try:
        yield rpc_agents.api(name)
    except BaseException:
        stop_quietly()
        raise
    else:
        if _STATE.running is not None and not _STATE.running.shared:
            stop(graceful=True)


def is_running() -> bool:
    return _STATE.running is not None


def _register_harness_hook() -> None:
    """Stop the agent before the harness destroys process groups (see module docstring)."""
    try:
        from fixtures import rank_main
    except ImportError:
        return
    hooks = getattr(rank_main, "BEFORE_PG_DESTROY", None)
    if hooks is not None and stop_quietly not in hooks:
        hooks.append(stop_quietly)


_register_harness_hook()
