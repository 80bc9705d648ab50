"""The project's own tests: a run over the whole folder gets pytest-xdist workers; the suite runs inside stay one process.

Most of the project's tests start a pytest of the conformance suite, a
launcher or a world in a subprocess and wait for it, so ``pytest tests/``
runs in ``default_workers()`` pytest-xdist workers (``pytest_distconform_workers``
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


def pytest_distconform_workers(config: pytest.Config) -> int | None:
    """Workers when the run names this whole folder; otherwise no opinion (one process: DISTCONFORM_WORKERS=0)."""
    base = Path(config.invocation_params.dir)
    if any((base / arg).resolve() == TESTS for arg in config.args if "::" not in arg):
        return default_workers()
    return None


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's load scheduling first hands each worker a run of consecutive tests, a quarter of its share (108 of
    # 1300 here): the control and all 33 gallery runs, first by starts_first below, went to one worker, which ran on
    # alone for 230 s of a 909 s CI run after the other two had finished. One test at a time per worker (each asks
    # for the next when it runs low) makes longest-first a schedule; the messages cost nothing beside the tests.
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1
    # A module-scoped fixture is made once per worker that runs one of its tests: the nine pytest runs of
    # test_cli.py's cheap_runs were made by all three workers (42-57 s each under load), test_rpc_plugin.py's,
    # test_reports.py's and test_report_html.py's runs alike (about 200 s of a 3230 s run's worker time).
    # pytest-xdist's loadgroup sends the tests of an xdist_group to one worker (a module whose tests share such
    # a fixture sets ``pytestmark = pytest.mark.xdist_group("<module>")``) and hands every other test out
    # alone, as load does; its queue keeps collection order (no reordering by group size), so starts_first
    # still decides what starts first.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
        config.option.loadscopereorder = False
    config.addinivalue_line("markers", "starts_first(order=0): one of the run's longest tests (the gallery's control, "
                                       "about two minutes under CI's load, then the gallery's runs): started before "
                                       "the others, lowest order first, so no worker is left alone with one at the "
                                       "end of a run over this folder")


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
    """Where the launch tests' simulated nodes run (tests/harness_cases/launch_nodes.py): the run's --hosts,
    ``none`` (this host's loopback) or ``netns`` (each node on a simulated host of its own; skips saying why
    where simulated hosts cannot be made)."""
    mode = request.config.getoption("hosts")
    if mode == "netns":
        from fixtures.hosts import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            pytest.skip(f"--hosts netns: {reason}")
    return mode
