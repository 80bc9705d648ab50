"""The RPC agent axis (fixtures/rpc_plugin.py), agent specs (backends/rpc_agents.py) and the rank-side agent
lifecycle (fixtures/rpc_lifecycle.py): option parsing, ids and ordering, gaps, reuse/restart of the shared agent,
the harness hook that stops an agent before process groups are re-created, and the report fields."""

import json
import re
from dataclasses import replace

import pytest

from backends import rpc_agents
from backends.registry import BackendRegistry
from fixtures.rank import ctx
from fixtures.world import World
from tests.harness_cases.procs import finish_pytest, start_pytest


pytestmark = pytest.mark.timeout(300)

ADDRESSING = "suites/rpc/test_addressing.py"
FUTURES_AND_SHUTDOWN = ["suites/rpc/test_futures.py", "suites/rpc/test_shutdown.py"]


# ------------------------------------------------------------- specs as data
def test_every_agent_has_a_spec_with_a_timeout_text():
    assert set(rpc_agents.AGENTS) == {"tensorpipe", "tensorpipe-shm", "reference-pg", "reference-tp"}
    for spec in rpc_agents.AGENTS.values():
        assert spec.timeout_error and re.compile(spec.timeout_error)
        assert all(gap.reason for gap in spec.gaps), spec.name
    assert re.search(rpc_agents.get("tensorpipe").timeout_error,
                     "RPCErr:1:RPC ran for more than set timeout (400 ms) and will now be marked with an error")


def test_default_agents_leave_out_the_shm_variant():
    """tensorpipe runs over uv by default (shm busy-polls); tensorpipe-shm keeps TensorPipe's own choice."""
    assert rpc_agents.default_agents() == ["tensorpipe", "reference-pg", "reference-tp"]
    assert rpc_agents.get("tensorpipe").tensorpipe_transports == ("uv",)
    shm = rpc_agents.get("tensorpipe-shm")
    assert shm.tensorpipe_transports is None and not shm.selected_by_default
    assert shm.gaps == rpc_agents.get("tensorpipe").gaps


def test_unknown_agent_names_the_known_ones():
    with pytest.raises(rpc_agents.UnknownAgent, match="'nope'.*tensorpipe, tensorpipe-shm, reference-pg, reference-tp"):
        rpc_agents.get("nope")


def test_gap_matches_only_what_it_names():
    tensorpipe = rpc_agents.get("tensorpipe")
    assert tensorpipe.gap_for(rpc_feature="custom_exception_type", rpc_call="rpc_sync") is not None
    assert tensorpipe.gap_for(rpc_feature="custom_exception_type", rpc_call="remote") is None
    assert tensorpipe.gap_for(rpc_feature="async_execution") is None
    assert rpc_agents.get("reference-tp").gap_for(rpc_feature="wait_all_early_error") is not None


def test_unimportable_agent_is_unavailable_with_reason():
    spec = rpc_agents.AgentSpec(name="ghost", module="no_such_module_for_rpc", description="", timeout_error="x")
    availability = spec.availability()
    assert not availability.available and "no_such_module_for_rpc" in availability.reason


# ------------------------------------------------------------- command line
@pytest.fixture(scope="module")
def cheap_runs(tmp_path_factory):
    """Runs that start no world, launched together."""
    base = tmp_path_factory.mktemp("rpc-cli")
    specs = {
        "nope": [ADDRESSING, "--rpc-agent", "tensorpipe,nope"],
        "empty": [ADDRESSING, "--rpc-agent", ","],
        "collect": [*FUTURES_AND_SHUTDOWN, "--collect-only", "-q", "--world-size", "2,3",
                    "--rpc-agent", "reference-tp,tensorpipe"],
    }
    handles = {name: start_pytest(args, base / name) for name, args in specs.items()}
    return {name: finish_pytest(handle) for name, handle in handles.items()}


def test_unknown_agent_is_a_usage_error(cheap_runs):
    run = cheap_runs["nope"]
    assert run.returncode == 4, run.output  # pytest.ExitCode.USAGE_ERROR
    assert "--rpc-agent" in run.output and "'nope'" in run.output and "reference-tp" in run.output
    assert "Traceback" not in run.output


def test_empty_agent_list_is_a_usage_error(cheap_runs):
    run = cheap_runs["empty"]
    assert run.returncode == 4 and "no agent given" in run.output, run.output


def test_ids_name_backend_world_size_agent_and_blocks_are_contiguous(cheap_runs):
    run = cheap_runs["collect"]
    assert run.returncode == 0, run.output
    ids = [line for line in run.output.splitlines() if "::" in line]
    blocks = [re.search(r"\[(gloo-ws\d-(?:tensorpipe|reference-tp))", i).group(1) for i in ids]
    assert blocks[0] == "gloo-ws2-reference-tp", "agents run in --rpc-agent order"
    seen = []
    for block in blocks:
        if not seen or seen[-1] != block:
            assert block not in seen, f"block {block} is split: each (world, agent) must start its agent once"
            seen.append(block)
    assert seen == ["gloo-ws2-reference-tp", "gloo-ws2-tensorpipe", "gloo-ws3-reference-tp", "gloo-ws3-tensorpipe"]
    for block in seen:  # clauses with an agent of their own (shutdown) come last in their block
        kinds = ["shutdown" in i for i, b in zip(ids, blocks) if b == block]
        assert kinds == sorted(kinds), f"{block}: a private-agent clause runs before a shared-agent one"


def futures_cases(tmp_path, agents: str) -> list[dict]:
    """Two clauses of suites/rpc/test_futures.py on ``agents`` at world size 2: the cases of its report."""
    run = finish_pytest(start_pytest(["suites/rpc/test_futures.py", "--world-size", "2", "--rpc-agent", agents,
                                      "-k", "first_error_wins or returns_values"], tmp_path))
    assert run.returncode == 0, run.output
    with open(tmp_path / "conformance.json") as fh:
        return json.load(fh)["cases"]


@pytest.fixture(scope="module")
def futures_run(tmp_path_factory):
    """One run of futures_cases for the two tests below (a pytest and its world to start, once): reference-tp,
    then tensorpipe-shm, then tensorpipe (so tensorpipe still follows tensorpipe-shm in the same world). The two
    tests stay next to each other: pytest-xdist hands out consecutive tests together, so one worker runs both."""
    folder = tmp_path_factory.mktemp("futures")
    return futures_cases(folder, "reference-tp,tensorpipe-shm,tensorpipe"), folder


def of_agents(cases: list[dict], *agents: str) -> list[dict]:
    return [c for c in cases if c["rpc_agent"] in agents]


def test_shm_variant_runs_when_named(futures_run):
    """An agent offered is an agent exercised: tensorpipe-shm, then tensorpipe, in the same world's processes."""
    cases = of_agents(futures_run[0], "tensorpipe-shm", "tensorpipe")
    assert {(c["rpc_agent"], c["outcome"]) for c in cases} == {("tensorpipe-shm", "passed"),
                                                               ("tensorpipe", "passed")}, cases


def test_report_carries_agent_and_gap(futures_run):
    cases, tmp_path = futures_run
    cases = of_agents(cases, "reference-tp", "tensorpipe")
    by_agent = {(c["rpc_agent"], c["outcome"]) for c in cases}
    assert by_agent == {("reference-tp", "passed"), ("reference-tp", "xfailed"), ("tensorpipe", "passed")}, cases
    gap = next(c for c in cases if c["outcome"] == "xfailed")
    assert gap["reason"].startswith("RPC agent reference-tp: ") and "set_exception" in gap["reason"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| gloo · rpc reference-tp | rpc |" in summary and "| gloo · rpc tensorpipe | rpc |" in summary


# ------------------------------------------------------------- agents from plugins
EXTRA_AGENT = "tests.harness_cases.extra_agent"


def test_agent_plugin_registers_its_spec_once():
    from tests.harness_cases import extra_agent

    try:
        assert rpc_agents.load_plugin(EXTRA_AGENT) == [extra_agent.DISTCONFORM_RPC_AGENTS]
        rpc_agents.load_plugin(EXTRA_AGENT)  # again (pytest, then every rank): a no-op
        spec = rpc_agents.get(extra_agent.NAME)
        assert spec.transport == rpc_agents.get("reference-tp").transport
        assert spec.gap_for(rpc_feature="wait_all_early_error").outcome == "skip"
        with pytest.raises(ValueError, match="already defined"):
            rpc_agents.register(replace(spec, description="another"))
    finally:
        rpc_agents.AGENTS.pop(extra_agent.NAME, None)


def test_agent_plugin_without_specs_is_refused():
    with pytest.raises(rpc_agents.RpcAgentPluginError, match="DISTCONFORM_RPC_AGENTS"):
        rpc_agents.load_plugin("tests.harness_cases.procs")
    with pytest.raises(rpc_agents.RpcAgentPluginError, match="import failed"):
        rpc_agents.load_plugin("no_such_module_for_rpc")


def test_agent_from_a_plugin_is_parametrised_into_the_rpc_clauses_with_its_gap(tmp_path):
    run = finish_pytest(start_pytest(["suites/rpc/test_futures.py", "--world-size", "2",
                                      "--rpc-agent-plugin", EXTRA_AGENT,
                                      "-k", "reference-tp-extra and (first_error_wins or returns_values)"],
                                     tmp_path))
    assert run.returncode == 0, run.output
    with open(tmp_path / "conformance.json") as fh:
        cases = json.load(fh)["cases"]
    # the default --rpc-agent is every agent, the plugin's included; -k kept the plugin's cases
    assert {(c["rpc_agent"], c["outcome"]) for c in cases} == {("reference-tp-extra", "passed"),
                                                               ("reference-tp-extra", "skipped")}, cases
    gap = next(c for c in cases if c["outcome"] == "skipped")
    assert gap["reason"].startswith("RPC agent reference-tp-extra: ") and "plugin" in gap["reason"]


def test_unknown_agent_plugin_is_a_usage_error(tmp_path):
    run = finish_pytest(start_pytest([ADDRESSING, "--rpc-agent-plugin", "no_such_module_for_rpc"], tmp_path))
    assert run.returncode == 4 and "--rpc-agent-plugin no_such_module_for_rpc" in run.output, run.output


# ------------------------------------------------------------- rank-side lifecycle
def prepare(name, shared=True, restart=False):
    from fixtures import rpc_lifecycle as lifecycle

    return lifecycle.prepare(name, shared=shared, restart=restart)["action"]


def whoami_through_agent():
    from fixtures import rpc_lifecycle as lifecycle
    from suites.rpc import udfs

    return lifecycle.rpc().rpc_sync(f"worker{(ctx.rank + 1) % ctx.world_size}", udfs.whoami)


def agent_running():
    from fixtures import rpc_lifecycle as lifecycle

    return lifecycle.is_running()


@pytest.fixture(scope="module")
def rpc_world():
    world = World(BackendRegistry().get("gloo"), 2, ("cpu", "cpu"), deadline=60).start()
    yield world
    world.close()


@pytest.mark.parametrize("name", ["reference-tp", "tensorpipe"])
def test_shared_agent_is_reused_restarted_and_stopped_on_reinit(rpc_world, name):
    world = rpc_world
    assert world.run(prepare, name) == ["started"] * 2
    assert world.run(whoami_through_agent) == ["worker1", "worker0"]
    assert world.run(prepare, name) == ["reused"] * 2
    # after a failure the fixture asks for a restart; TensorPipe cannot start twice in a process
    want = "new_process" if rpc_agents.get(name).one_start_per_process else "started"
    assert world.run(prepare, name, True, True) == [want] * 2
    if want == "started":
        assert world.run(whoami_through_agent) == ["worker1", "worker0"]
        world.reset()  # the harness re-creates process groups: the agent is stopped first
        assert world.run(agent_running) == [False, False]
    else:
        assert world.run(agent_running) == [False, False]
