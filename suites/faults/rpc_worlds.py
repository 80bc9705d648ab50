"""Fixtures of the RPC fault clauses: worlds on simulated hosts, each (agent, fault, kind) scenario run once.

One private world per (backend, world size) on simulated hosts (``WorldPool.private_world(..., hosts="netns")``)
serves the scenarios of every agent. A scenario that may leave something running in the ranks (an agent that
starts once per process, TensorPipe; a graceful shutdown or a start under a fault; a call that never came back)
ends its world: the next scenario gets new processes. test_rpc_faults.py imports these fixtures; ``rpc_agent``
there is the agent's spec (the clauses start their own agents), not suites/rpc's shared agent.
"""

from __future__ import annotations

import pytest

from backends import rpc_agents
from fixtures.pytest_plugin import pool_of
from fixtures.world import World
from suites.faults.rpc_scenario import RpcScenario, run_rpc_scenario
from suites.faults.table import TABLE


class HostedAgents:
    def __init__(self, config) -> None:
        self.config = config
        self.worlds: dict[tuple[str, int], World] = {}
        self.scenarios: dict[tuple, RpcScenario] = {}

    def scenario(self, backend_spec, world_size: int, agent: str, fault: str, kind: str) -> RpcScenario:
        key = (backend_spec.name, world_size, agent, fault, kind)
        if key not in self.scenarios:
            pool = pool_of(self.config)
            reason = pool.cannot_host(backend_spec, world_size, hosts="netns")
            if reason:
                pytest.skip(reason)
            world = self.worlds.get(key[:2])
            if world is None or not world.alive:
                world = self.worlds[key[:2]] = pool.private_world(backend_spec.name, world_size, hosts="netns")
            try:
                found = self.scenarios[key] = run_rpc_scenario(world, agent, TABLE[fault], kind)
            except BaseException:
                world.kill()  # a rank raised or hung: the next scenario gets new processes
                raise
            if kind != "calls" or rpc_agents.get(agent).one_start_per_process or not found.clean:
                world.kill()
        return self.scenarios[key]

    def close(self) -> None:
        for world in self.worlds.values():
            world.close()


@pytest.fixture(scope="session")
def hosted_agents(request):
    agents = HostedAgents(request.config)
    yield agents
    agents.close()


@pytest.fixture
def rpc_agent(rpc_agent_name) -> rpc_agents.AgentSpec:
    """The agent under test's spec (its name, declared state after faults); the scenarios start the agent."""
    return rpc_agents.get(rpc_agent_name.name)
