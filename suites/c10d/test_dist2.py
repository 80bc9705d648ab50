"""Contract: a torch.distributed._dist2 group runs every collective method, and a backend registered through it works.

``torch.distributed._dist2`` is torch's experimental object API (torch 2.11 and 2.13 ship it; 2.14.1 does not):
``new_group(backend, timeout, device)`` rendezvouses through ``env://`` and makes an independent ProcessGroup
with the factory registered under the backend's name (``register_backend(name, factory)``; torch registers
gloo and nccl). The group is not registered with torch.distributed, so only its own methods reach it:
each ProcessGroup method of the table's collectives (suites/collectives.py ``group_methods``) must give the
oracle's result on it, as on the default group (test_method_names.py). ``process_group(pg)`` makes it
``current_process_group()`` inside the block and restores the previous one after.

A backend torch does not register there is registered through ``_dist2.register_backend`` by the adapter
below, from its c10d plugin registration (``Backend.register_backend``): the path a vendor's backend takes.
Each world makes its group once (rank 0 offers a free ephemeral port for env://, over the case store).
"""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.c10d.test_method_names import expect_method_results, method_results, name_set_cases

DIST2 = "torch.distributed._dist2"
GROUP_TIMEOUT = timedelta(seconds=30)
ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def _present() -> bool:
    try:
        importlib.import_module(DIST2)
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _present(), reason=f"torch {torch.__version__} has no {DIST2} (torch 2.11 "
                                                        f"and 2.13 ship the experimental API, 2.14.1 does not)")


# ----------------------------------------------------------- rank side: the group
def c10d_plugin_factory(name: str):
    """A _dist2 factory making backend ``name`` as its c10d plugin registration does (extended API or not); a
    Backend it returns is put in a ProcessGroup of its own, on the group's device, as _dist2's gloo factory does."""
    def factory(store, rank: int, world_size: int, timeout: timedelta, device: torch.device, **kwargs):
        plugin = dist.Backend._plugins[name.upper()]  # c10d keeps the registrations here, and only here
        if plugin.extended_api:
            options = dist.distributed_c10d._DistributedBackendOptions()
            options.store, options.group_rank, options.group_size, options.timeout = store, rank, world_size, timeout
            options.group_id, options.global_ranks_in_group = "dist2", list(range(world_size))
            made = plugin.creator_fn(options, None)
        else:
            made = plugin.creator_fn(store, rank, world_size, timeout)
        if isinstance(made, dist.ProcessGroup):
            return made
        group = dist.ProcessGroup(store, rank, world_size)
        group._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        group._register_backend(device, dist.ProcessGroup.BackendType.CUSTOM, made)
        return group
    return factory


@contextmanager
def _rendezvous_env(port: str) -> Iterator[None]:
    """env:// for this rank (what _dist2.new_group reads), the rank's own environment restored after."""
    saved = {var: os.environ.get(var) for var in ENV_VARS}
    os.environ.update(RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # rank 0 hosts the store, as without an agent
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dist2_group():
    """This world's _dist2 group of every rank on the backend under test (made once per world)."""
    if "dist2" not in ctx.scratch:
        d2 = importlib.import_module(DIST2)
        name = ctx.spec.init_backend
        try:
            d2.register_backend(name, c10d_plugin_factory(name))
        except ValueError:  # "Backend gloo already registered": torch's own factory, or one its plugin registered
            pass
        if ctx.rank == 0:
            ctx.store.set("dist2/port", str(_free_port()))
        with _rendezvous_env(ctx.store.get("dist2/port").decode()):
            ctx.scratch["dist2"] = d2.new_group(name, GROUP_TIMEOUT, ctx.device)
    return ctx.scratch["dist2"]


def dist2_method(name: str, method: str) -> list:
    return method_results(dist2_group(), name, method)


def identity_and_context() -> dict:
    """What the group says of itself, whether c10d knows it, and current_process_group() around process_group()."""
    d2 = importlib.import_module(DIST2)
    group = dist2_group()
    try:
        dist.get_process_group_ranks(group)
        c10d_knows = "yes"
    except Exception as exc:  # what an unregistered group gets from the torch.distributed API
        c10d_knows = f"{type(exc).__name__}: {exc}"
    before = d2.current_process_group()
    with d2.process_group(group):
        inside = d2.current_process_group()
    after = d2.current_process_group()
    return {"rank": group.rank(), "size": group.size(), "c10d_knows": c10d_knows,
            "inside_is_group": inside is group, "restored": after is before}


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("name,method", name_set_cases())
def test_dist2_group_runs_every_collective_method(world, name, method):
    """Each ProcessGroup method of a collective gives the oracle's result on a _dist2 group of every rank."""
    expect_method_results(world.run(dist2_method, name, method), name, method)


def test_dist2_group_is_independent_and_current_inside_process_group(world):
    """The group has the world's ranks, is unknown to torch.distributed, and is current only inside process_group()."""
    for rank, seen in enumerate(world.run(identity_and_context)):
        assert (seen["rank"], seen["size"]) == (rank, world.world_size), f"rank {rank}: {seen}"
        assert seen["c10d_knows"] != "yes", f"rank {rank}: torch.distributed knows the _dist2 group (ranks listed)"
        assert seen["inside_is_group"], f"rank {rank}: inside process_group(pg) current_process_group() is another group"
        assert seen["restored"], f"rank {rank}: after process_group(pg) the previous current group was not restored"
