"""fixtures/workers.py: a run over suites/ gets pytest-xdist workers unless its command line says otherwise."""

from __future__ import annotations

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


def test_the_project_tests_go_to_workers_one_at_a_time(pytestconfig):
    """tests/conftest.py: xdist's first chunk per worker (a quarter of its share, consecutive) gave one worker the
    control and every gallery run, 230 s alone at the end of CI; one test at a time spreads the longest-first ones."""
    if any(arg.startswith("--maxschedchunk") for arg in pytestconfig.invocation_params.args):
        pytest.skip("the command line set --maxschedchunk")
    assert pytestconfig.option.maxschedchunk == 1
    if hasattr(pytestconfig, "workerinput"):  # under workers: loadgroup, in collection order (tests/conftest.py)
        assert (pytestconfig.option.dist, pytestconfig.option.loadscopereorder) == ("loadgroup", False)
