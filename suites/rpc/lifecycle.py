"""Rank side of the RPC agent lifecycle: one shared agent per (world, agent), private ones on demand.

Starting an agent costs about a second (TensorPipe), so every rank keeps the
agent of the last test running and the next test of the same agent reuses it
(``prepare``, called by the ``rpc_agent`` fixture before each test). A clause
that needs its own configuration (fault injection, a short default timeout)
or that shuts the agent down runs inside ``private_agent``: the shared agent
is stopped first and nothing is left running afterwards, so the next test
starts the shared one again.

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from backends import rpc_agents
from fixtures.rank import ctx

STORE_WAIT_S = 30.0
# Shorter than the harness deadline (30 s), so a lost reply fails as an RPC
# timeout naming the call rather than as a world-killing hang.
SHARED_RPC_TIMEOUT_S = 10.0


@dataclass
class Running:
    name: str
    key: str  # the store prefix of this start: names the start on every rank
    shared: bool
    tmpdir: str | None = None


@dataclass
class _State:
    name: str = ""  # the agent under test in this rank (set by ``prepare``)
    running: Running | None = None
    case_id: int = -1
    starts_in_case: int = 0
    started: set = field(default_factory=set)  # agent names ever started in this process
    # Rank 0's rendezvous dirs of stopped agents, with the case that stopped them.
    # Removed only in a later case: a peer may still read the FileStore while
    # it leaves the graceful-shutdown handshake after this rank has returned.
    stale_dirs: list = field(default_factory=list)


_STATE = _State()


def current_name() -> str:
    if not _STATE.name:
        raise RuntimeError("no RPC agent was chosen in this rank (the rpc_agent fixture chooses one)")
    return _STATE.name


def rpc():
    """The torch.distributed.rpc-like module of the agent under test in this rank."""
    return rpc_agents.api(current_name())


def _next_key() -> str:
    if _STATE.case_id != ctx.case_id:
        _STATE.case_id, _STATE.starts_in_case = ctx.case_id, 0
    _STATE.starts_in_case += 1
    return f"rpc-agent/case{ctx.case_id}/start{_STATE.starts_in_case}"


def _remove_stale_dirs(everything: bool = False) -> None:
    keep = []
    for case_id, path in _STATE.stale_dirs:
        if everything or case_id != ctx.case_id:
            shutil.rmtree(path, ignore_errors=True)
        else:
            keep.append((case_id, path))
    _STATE.stale_dirs = keep


def _start(name: str, *, shared: bool, **options) -> Running:
    _remove_stale_dirs()
    key = _next_key()
    store = dist.PrefixStore(key, ctx.base_store)
    store.set_timeout(timedelta(seconds=STORE_WAIT_S))
    tmpdir = None
    if ctx.rank == 0:
        tmpdir = tempfile.mkdtemp(prefix="distconform-rpc-")
        store.set("init_dir", tmpdir)
    init_dir = store.get("init_dir").decode()
    running = Running(name, key, shared, tmpdir)
    options.setdefault("rpc_timeout", SHARED_RPC_TIMEOUT_S)
    _STATE.started.add(name)
    rpc_agents.start_agent(name, rank=ctx.rank, world_size=ctx.world_size, store=dist.PrefixStore("agent", store),
                           init_file=os.path.join(init_dir, "rendezvous"), **options)
    _STATE.running = running
    return running


def stop(graceful: bool = True) -> None:
    """Stop this rank's agent, if any; the state is cleared even if shutdown raises."""
    running, _STATE.running = _STATE.running, None
    if running is None:
        return
    try:
        rpc_agents.stop_agent(running.name, graceful=graceful)
    finally:
        if running.tmpdir:
            _STATE.stale_dirs.append((ctx.case_id, running.tmpdir))


def stop_quietly() -> None:
    """For restarts: never raise, never wait for peers."""
    try:
        stop(graceful=False)
    except Exception:
        pass


def before_pg_destroy() -> None:
    """The harness's hook (re-initialisation after a failure, process exit)."""
    stop_quietly()
    _remove_stale_dirs(everything=True)


def prepare(name: str, *, shared: bool, restart: bool = False) -> dict:
    """Get every rank ready for the next clause on agent ``name``; collective.

    ``shared``: the clause uses the shared agent: reuse it when every rank
    already runs it (and no restart was asked for), else start it. Not
    shared: the clause starts its own (``private_agent``); stop the shared one.

    Ranks first agree through the case store on what they run: a start is
    collective, so one rank reusing while another restarts would hang both.
    An agent that can start only once per process
    (``AgentSpec.one_start_per_process``) answers ``new_process`` instead of
    starting twice; the fixture then replaces the world's processes.
    """
    spec = rpc_agents.get(name)
    mine = _STATE.running
    reusable = mine is not None and mine.shared and mine.name == name and not restart
    state = mine.key if reusable else "-"
    spent = name in _STATE.started and spec.one_start_per_process
    ctx.store.set(f"agent_state/{ctx.rank}", f"{state}|{int(spent)}")
    states = [ctx.store.get(f"agent_state/{r}").decode().split("|") for r in range(ctx.world_size)]
    _STATE.name = name
    if shared and state != "-" and all(s[0] == state for s in states):
        return {"action": "reused", "key": mine.key}
    if not shared and mine is None and all(s[0] == "-" and s[1] == "0" for s in states):
        return {"action": "none"}
    # A graceful stop needs every rank's agent to take part; only the same
    # healthy start everywhere qualifies.
    if state != "-" and all(s[0] == state for s in states):
        try:
            stop(graceful=True)
        except Exception:
            stop_quietly()
    else:
        stop_quietly()
    if any(s[1] == "1" for s in states):
        return {"action": "new_process"}
    if not shared:
        return {"action": "stopped"}
    return {"action": "started", "key": _start(name, shared=True).key}


@contextmanager
def private_agent(**options):
    """Run a clause on an agent of its own (the agent under test, its own configuration).

    ``options`` go to ``start_agent`` (``faults=``, ``rpc_timeout=``). On exit
    the private agent is shut down gracefully unless the body already did,
    and no agent is left running: the next test starts the shared one again.
    """
    name = current_name()
    stop(graceful=True)
    running = _start(name, shared=False, **options)
    try:
        yield rpc_agents.api(name)
    except BaseException:
        stop_quietly()
        raise
    else:
        if _STATE.running is not running:
            return
        if options.get("faults") is not None:
            # An agent that injected faults may still hold delayed or failed
            # messages (a timed-out remote()'s RRef bookkeeping): TensorPipe's
            # graceful join then waits on them past its store timeout ("Wait
            # timeout", seen under load). These clauses are about timeouts;
            # graceful shutdown has its own clauses, without faults. So: every
            # rank done with its calls (a store barrier), then stop at once.
            _store_barrier(f"faulty-done/{running.key}")
            stop(graceful=False)
        else:
            stop(graceful=True)


def _store_barrier(key: str) -> None:
    """All ranks of the world reached this point (through the world's store, not the backend under test)."""
    if ctx.base_store.add(key, 1) == ctx.world_size:  # the last to arrive lets everyone go
        ctx.base_store.set(f"{key}/go", b"1")
    ctx.base_store.wait([f"{key}/go"], timedelta(seconds=STORE_WAIT_S))


def is_running() -> bool:
    return _STATE.running is not None


def _register_harness_hook() -> None:
    """Stop the agent before the harness destroys process groups (see module docstring)."""
    try:
        from fixtures import rank_main
    except ImportError:
        return
    hooks = getattr(rank_main, "BEFORE_PG_DESTROY", None)
    if hooks is not None and before_pg_destroy not in hooks:
        hooks.append(before_pg_destroy)


_register_harness_hook()
