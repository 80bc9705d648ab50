"""fixtures/workers.py: a run over suites/ gets pytest-xdist workers unless its command line says otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import workers
from tests.harness_cases.procs import finish_pytest, start_pytest

BARRIER = "suites/c10d/test_barrier.py"


def test_default_is_one_more_than_the_cores_within_bounds():
    assert workers.default_workers(1) == 2
    assert workers.default_workers(2) == 3
    assert workers.default_workers(64) == workers.MAX_DEFAULT_WORKERS


def test_environment_value_must_be_a_number(monkeypatch):
    monkeypatch.setenv(workers.ENV, "lots")
    with pytest.raises(pytest.UsageError, match="DISTCONFORM_WORKERS='lots'"):
        workers.env_workers()
    monkeypatch.setenv(workers.ENV, "0")
    assert workers.env_workers() == 0


@pytest.mark.parametrize("env, args, expect", [
    ("2", [BARRIER, "-k", "waits_for_the_late_rank"], "2 workers"),  # the environment's count
    ("2", ["-n", "0", BARRIER, "-k", "waits_for_the_late_rank"], None),  # the command line decides
    ("", [BARRIER, "-k", "waits_for_the_late_rank"], f"{workers.default_workers()} workers"),  # the default
    ("", [f"{BARRIER}::test_barrier_waits_for_the_late_rank"], None),  # node ids: one process
])
def test_who_decides(tmp_path, monkeypatch, env, args, expect):
    if env:
        monkeypatch.setenv(workers.ENV, env)
    else:
        monkeypatch.delenv(workers.ENV, raising=False)
    run = finish_pytest(start_pytest([*args, "--world-size", "2"], tmp_path))
    assert run.returncode == 0, run.output
    if expect:
        assert expect in run.output, run.output
    else:
        assert "workers" not in run.output, run.output


def test_the_project_tests_go_to_workers_alone_but_a_modules_shared_runs_together():
    """tests/worker_schedule.py: every test is a unit of its own (load scheduling's first chunk of consecutive tests
    once gave one worker the control and every gallery run, 230 s alone at the end of CI), except that the tests of a
    module whose fixtures are runs of the suite are one unit; each such module has a module-scoped fixture."""
    from tests.worker_schedule import SHARED_RUNS, SharedRunsTogether

    scheduler = SharedRunsTogether.__new__(SharedRunsTogether)  # _split_scope reads nothing the constructor sets
    assert scheduler._split_scope("tests/test_cli.py::test_a[x]") == scheduler._split_scope("tests/test_cli.py::test_b")
    assert scheduler._split_scope("tests/test_world.py::test_a") != scheduler._split_scope("tests/test_world.py::test_b")
    for module in SHARED_RUNS:
        assert 'scope="module"' in (Path(__file__).parents[1] / module).read_text(), module
