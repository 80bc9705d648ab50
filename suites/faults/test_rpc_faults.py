"""Contract: draft (measurement)."""

from __future__ import annotations

import json

import pytest

from suites.faults.rpc_worlds import hosted_agents, rpc_agent  # noqa: F401  (fixtures)


@pytest.mark.parametrize("kind,fault", [("shutdown", "partition")])
def test_measure(hosted_agents, backend_spec, world_target, rpc_agent, kind, fault):
    s = hosted_agents.scenario(backend_spec, world_target.world_size, rpc_agent.name, fault, kind)
    with open(f"/tmp/rpcf/{rpc_agent.name}-ws{world_target.world_size}-{kind}-{fault}.json", "w") as out:
        json.dump(s.__dict__, out, indent=1, default=str)
