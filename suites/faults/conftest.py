"""Fixtures of the fault clauses: worlds on simulated hosts, each fault's scenario run once per world, and ``--faults``.

A fault clause's world is private (``WorldPool.private_world(..., hosts="netns")``), whatever the run's
--hosts: every rank on a host of its own, the store on the switch. One world per (backend, world size) serves
every fault; each fault runs once per kind of scenario (table.WHEN) and all its clauses read the one
``Scenario``. A world a scenario left with a call stuck in the backend is replaced before the next. Without root
or ``ip netns`` the clauses skip, saying so.

``--faults`` (fixtures/pytest_plugin.py) chooses the faults: by default one per kind (DEFAULT_FAULTS) at the run's
smallest world size, without the clauses marked ``fault_matrix`` (the first collective under lazy init and the
group's ending after it, which wait long on gloo); ``all`` every fault of the table, or a list of names, each with
those clauses too. Cases of the other faults are deselected, as --soak's heavy cases are.
"""

from __future__ import annotations

import os

import pytest

from fixtures.pytest_plugin import pool_of
from fixtures.world import World
from suites.faults import figures
from suites.faults.scenario import Scenario, run_scenario
from suites.faults.table import TABLE, named

DEFAULT_FAULTS = ("partition", "refused", "slow")  # one of each kind: silence, reset, negative control
HERE = os.path.dirname(os.path.abspath(__file__))


class HostedWorlds:
    def __init__(self, config) -> None:
        self.config = config
        self.worlds: dict[tuple[str, int], World] = {}
        self.scenarios: dict[tuple[str, int, str, str], Scenario] = {}

    def scenario(self, backend_spec, world_size: int, fault: str, when: str = "mid_operation") -> Scenario:
        key = (backend_spec.name, world_size, fault, when)
        if key not in self.scenarios:
            if when == "before_connect" and backend_spec.lazy_connect_env is None:
                pytest.skip(f"{backend_spec.name} declares no lazy connection switch (BackendSpec.lazy_connect_env): "
                            "its groups connect when they are made, so no fault comes before a first connection")
            pool = pool_of(self.config)
            reason = pool.cannot_host(backend_spec, world_size, hosts="netns")
            if reason:
                pytest.skip(reason)
            world = self.worlds.get(key[:2])
            if world is None or not world.alive:
                world = self.worlds[key[:2]] = pool.private_world(backend_spec.name, world_size, hosts="netns")
            try:
                self.scenarios[key] = run_scenario(world, TABLE[fault], when, lazy_env=backend_spec.lazy_connect_env)
            except BaseException:
                world.kill()  # a rank raised or hung: the next fault gets new processes
                raise
            if self.scenarios[key].stuck:
                world.kill()  # a call left running in the backend: the next fault gets new processes
        return self.scenarios[key]

    def close(self) -> None:
        for world in self.worlds.values():
            world.close()


@pytest.fixture(scope="session")
def hosted_worlds(request):
    worlds = HostedWorlds(request.config)
    yield worlds
    worlds.close()


@pytest.fixture
def scenario(request, hosted_worlds, backend_spec, world_target, fault) -> Scenario:
    """The one run of ``fault`` in the middle of a job, in this backend's hosted world at this world size; its
    figures go on the case (the report's Faults section)."""
    found = hosted_worlds.scenario(backend_spec, world_target.world_size, fault)
    figures.record(request, figures.collective_figures(found, backend_spec.name))
    return found


@pytest.fixture
def first_connect_scenario(request, hosted_worlds, backend_spec, world_target, fault) -> Scenario:
    """The one run of ``fault`` before a group's first connection, in this backend's hosted world."""
    found = hosted_worlds.scenario(backend_spec, world_target.world_size, fault, "before_connect")
    figures.record(request, figures.collective_figures(found, backend_spec.name))
    return found


def selected_faults(option: str) -> tuple[str, ...]:
    """The faults ``--faults`` names: 'default', 'all' or a comma-separated list (an unknown name is a usage error)."""
    if option == "default":
        return DEFAULT_FAULTS
    if option == "all":
        return tuple(TABLE)
    try:
        return tuple(f.name for f in named(option))
    except ValueError as exc:
        raise pytest.UsageError(f"--faults: {exc}") from None


def _world_size(item) -> int | None:
    target = item.callspec.params.get("world_target") if hasattr(item, "callspec") else None
    return getattr(target, "world_size", None)


def pytest_collection_modifyitems(config, items) -> None:
    option = config.getoption("faults")
    wanted = selected_faults(option)
    ours = [item for item in items if str(item.path).startswith(HERE + os.sep)]
    # The default form (the default run's share of the fault area) runs at one world size, the smallest the run has
    # from 2 up: every scenario starts processes of its own on simulated hosts, and at 2 and 3 the area cost the
    # default run about 135 s of worker time (73 s of it at ws3). --faults all or a list of names runs every size.
    sizes = sorted({n for n in map(_world_size, ours) if n is not None and n >= 2})
    smallest = sizes[0] if sizes and option == "default" else None
    left_out = [item for item in ours if (
        (hasattr(item, "callspec") and item.callspec.params.get("fault", wanted[0]) not in wanted)
        or (item.get_closest_marker("fault_matrix") and option == "default")
        or (smallest is not None and (_world_size(item) or smallest) > smallest))]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        gone = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in gone]
