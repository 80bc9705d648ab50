"""The project's own tests: a run over the whole folder gets pytest-xdist workers; the suite runs inside stay one process.

Most of the project's tests start a pytest of the conformance suite, a
launcher or a world in a subprocess and wait for it, so ``pytest tests/``
runs in ``project_tests_workers()`` pytest-xdist workers (``pytest_distconform_workers``
below; ``-n`` on the command line still decides, and a run of single files or
node ids stays one process). The suite runs those tests start stay one
process each (fixtures/workers.py would give a run over suites/ workers):
a test that wants workers passes ``-n`` itself, and the seeded-bug gallery
runs several bugs at once instead (tests/test_seeded_bugs.py). A value of
DISTCONFORM_WORKERS set by the caller is kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures.workers import ENV, default_workers

os.environ.setdefault(ENV, "0")
TESTS = Path(__file__).resolve().parent


def project_tests_workers() -> int:
    """One more worker than a run of the suite gets: most of these tests wait on a subprocess (a run of the suite, a
    launcher, a world), and the first ones started are the longest (the gallery's control, tox -e privateuse1's four
    commands), each about half waiting. Measured on this 2-core machine, `pytest tests/` alone, idle: 3 workers
    916.6 s, 1,507 CPU-s busy and 335 idle; 4 workers 766.3 s, 1,357 busy and 181 idle (both green)."""
    return default_workers() + 1


def pytest_distconform_workers(config: pytest.Config) -> int | None:
    """Workers when the run names this whole folder; otherwise no opinion (one process: DISTCONFORM_WORKERS=0)."""
    base = Path(config.invocation_params.dir)
    if any((base / arg).resolve() == TESTS for arg in config.args if "::" not in arg):
        return project_tests_workers()
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "starts_first(order=0): one of the run's longest tests (the gallery's control, "
                                       "about two minutes under CI's load, then tox -e privateuse1's commands and the "
                                       "gallery's runs): started before "
                                       "the others, lowest order first, so no worker is left alone with one at the "
                                       "end of a run over this folder")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's load scheduling, under workers (tests/worker_schedule.py: the tests of a module whose
    fixtures are runs of the suite go to one worker together, every other test alone, in collection order)."""
    if config.option.dist != "load":
        return None
    from tests.worker_schedule import SharedRunsTogether

    return SharedRunsTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``starts_first`` go first, by their order; the rest keep theirs (every xdist worker sorts alike).

    pytest-xdist hands out tests in collection order: the control and the
    gallery's runs, collected near the end of tests/, used to start when most
    of the run was done and end it alone (the last two minutes of a 12-minute
    run had one or two workers busy). Longest first is the usual remedy.
    """
    def order(item: pytest.Item) -> float:
        marker = item.get_closest_marker("starts_first")
        return float("inf") if marker is None else marker.args[0] if marker.args else 0

    items.sort(key=order)


@pytest.fixture(scope="session")
def launch_hosts(request: pytest.FixtureRequest) -> str:
    """Where the launch tests' simulated nodes run (tests/harness_cases/launch_nodes.py): ``netns`` (each node
    on a simulated host of its own), or ``none`` (this host's loopback). The run's ``--hosts`` decides where it
    names one (``--hosts netns`` skips saying why where simulated hosts cannot be made); otherwise simulated
    hosts wherever they can be made (root, ``ip netns``: CI's machine), so the launchers are exercised across
    hosts, and loopback elsewhere (the hosted-only cases then skip saying why)."""
    from fixtures.hosts import unavailable_reason

    named = any(arg == "--hosts" or arg.startswith("--hosts=") for arg in request.config.invocation_params.args)
    mode = request.config.getoption("hosts") if named else "netns"
    reason = unavailable_reason() if mode == "netns" else None  # asked once: it runs `ip netns list`
    if reason is None:
        return mode
    if named:
        pytest.skip(f"--hosts netns: {reason}")
    return "none"
