"""Fixtures of the profiling suite: TensorPipe's baseline and the parity report.

The baseline runs in a world of its own: TensorPipe starts once per process
(backends/rpc_agents.py), the shared worlds' processes may already have run
it, and it does not use the c10d backend under test, so a plain gloo world
of the same size gives the same profile. The run's pool (the answer to
``pytest_distconform_world_pool``) starts that world (``private_world``); a
pool with no processes to spare (a launched run) skips the case saying so.

That world's TensorPipe gets TP_WORKER_THREADS threads: torch 2.13's
TensorPipe agent profiles only the first profiled request each RPC worker
thread serves; later ones come back without remote events (measured: with
num_worker_threads=N exactly the first N profiled calls to a worker carry
them, then none). The shared 16-thread agent of suites/rpc would run dry
after 16 calls, so every clause of this suite runs TensorPipe here.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from backends import rpc_agents
from fixtures.pytest_plugin import pool_of
from fixtures.rpc_plugin import AgentSession
from fixtures.world import World
from reports.collector import report_dir
from suites.profiling import capture, parity
from suites.profiling.workloads import WORKLOADS


TP_WORKER_THREADS = 1024  # profiled requests each baseline worker can answer (see above)


class TensorPipeBaseline:
    """TensorPipe's event multiset per (world size, workload, call mode, options), sampled once per session."""

    def __init__(self, config):
        self.config = config
        self.worlds: dict[int, tuple] = {}
        self.cache: dict[tuple, tuple] = {}

    def world(self, world_size: int) -> World:
        if world_size not in self.worlds:
            availability = rpc_agents.get("tensorpipe").availability()
            if not availability.available:
                pytest.skip(f"no TensorPipe baseline: {availability.reason}")
            world = pool_of(self.config).private_world("gloo", world_size)
            init_dir = capture.new_init_dir()
            try:
                world.run(capture.start_tensorpipe, init_dir, TP_WORKER_THREADS)
            except BaseException:
                world.kill()
                raise
            self.worlds[world_size] = (world, init_dir)
        return self.worlds[world_size][0]

    def get(self, world_size: int, workload: str, rpc_call: str, **options) -> parity.Baseline:
        """What an agent must record for ``workload`` called the ``rpc_call`` way: TensorPipe's samples read by
        parity's rule."""
        key = (world_size, workload, rpc_call, tuple(sorted(options.items())))
        if key not in self.cache:
            world = self.world(world_size)
            world.run(capture.profile_workload, "tensorpipe", workload, rpc_call, warmup=1, **options)

            def sample():
                out = world.run(capture.profile_workload, "tensorpipe", workload, rpc_call, **options)[0]
                return parity.multiset(out["events"])

            self.cache[key] = parity.take_baseline(sample, racing=WORKLOADS[workload].races(rpc_call))
        return self.cache[key]

    def close(self) -> None:
        for world, init_dir in self.worlds.values():
            try:
                if world.alive:
                    world.run(capture.stop_tensorpipe)
            except Exception:
                pass
            world.close()
            shutil.rmtree(init_dir, ignore_errors=True)
        self.worlds.clear()


@pytest.fixture
def profiled_agent(rpc_agent, tensorpipe_baseline) -> AgentSession:
    """Where a clause profiles: the agent under test in its shared world, TensorPipe in the baseline world."""
    if rpc_agent.name == "tensorpipe":
        return AgentSession(rpc_agent.spec, tensorpipe_baseline.world(rpc_agent.world_size))
    return rpc_agent


@pytest.fixture(scope="session")
def tensorpipe_baseline(request):
    baseline = TensorPipeBaseline(request.config)
    yield baseline
    baseline.close()


def run_id(config) -> str:
    """Shared by the xdist workers of one run (their testrunuid), else one per process."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return str(workerinput["testrunuid"])
    return f"run-{os.getpid()}-{_STARTED}"


_STARTED = int(time.time())


class ParityReport:
    def __init__(self, config):
        self.dir = report_dir(config)
        self.run_id = run_id(config)

    def add(self, row: parity.ParityRow) -> None:
        parity.write_row(self.dir, self.run_id, row)

    def trace_path(self, name: str) -> str:
        return os.path.join(self.dir, "profiling", name)


@pytest.fixture(scope="session")
def parity_report(request) -> ParityReport:
    return ParityReport(request.config)


def pytest_sessionfinish(session):
    # every process (each xdist worker too) rewrites the summary from all rows of this run
    parity.write_summary(report_dir(session.config), run_id(session.config))
