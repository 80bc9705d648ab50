"""Fixtures of the fault clauses: worlds on simulated hosts, and each fault's scenario run once per world.

A fault clause's world is private (``WorldPool.private_world(..., hosts="netns")``), whatever the run's
--hosts: every rank on a host of its own, the store on the switch. One world per (backend, world size) serves
every fault; each fault runs once and all its clauses read the one ``Scenario``. Without root or ``ip netns``
the clauses skip, saying so.
"""

from __future__ import annotations

import pytest

from fixtures.pytest_plugin import pool_of
from fixtures.world import World
from suites.faults.scenario import Scenario, run_scenario
from suites.faults.table import TABLE


class HostedWorlds:
    def __init__(self, config) -> None:
        self.config = config
        self.worlds: dict[tuple[str, int], World] = {}
        self.scenarios: dict[tuple[str, int, str], Scenario] = {}

    def scenario(self, backend_spec, world_size: int, fault: str) -> Scenario:
        key = (backend_spec.name, world_size, fault)
        if key not in self.scenarios:
            pool = pool_of(self.config)
            reason = pool.cannot_host(backend_spec, world_size, hosts="netns")
            if reason:
                pytest.skip(reason)
            world = self.worlds.get(key[:2])
            if world is None or not world.alive:
                world = self.worlds[key[:2]] = pool.private_world(backend_spec.name, world_size, hosts="netns")
            try:
                self.scenarios[key] = run_scenario(world, TABLE[fault])
            except BaseException:
                world.kill()  # a rank raised or hung: the next fault gets new processes
                raise
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
def scenario(hosted_worlds, backend_spec, world_target, fault) -> Scenario:
    """The one run of ``fault`` in this backend's hosted world at this world size."""
    return hosted_worlds.scenario(backend_spec, world_target.world_size, fault)
