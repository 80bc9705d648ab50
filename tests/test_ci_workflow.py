"""The CI workflow runs the README's commands: a job per (backend, world size) and the project's own tests."""

import os
import re

from backends.registry import BackendRegistry
from tests.test_entry_points import REPO_ROOT, _quickstart_commands

WORKFLOW = os.path.join(REPO_ROOT, ".github", "workflows", "conformance.yml")


def workflow() -> str:
    with open(WORKFLOW) as fh:
        return fh.read()


def run_lines(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^\s*(?:- )?run:\s*(.+)$", text, re.M)]


def matrix_list(text: str, key: str) -> list[str]:
    found = re.search(rf"^\s*{re.escape(key)}:\s*\[(.*?)\]\s*$", text, re.M)
    assert found, f"matrix key {key!r} not found in {WORKFLOW}"
    return [part.strip().strip('"') for part in found.group(1).split(",")]


def test_conformance_jobs_run_readme_command_a_with_the_matrix_options():
    command_a, _ = _quickstart_commands()
    runs = run_lines(workflow())
    suite_runs = [r for r in runs if "pytest suites/" in r]
    assert len(suite_runs) == 1, runs
    line = suite_runs[0]
    assert line.startswith(command_a + " "), f"the workflow must run README command (a) verbatim, then options: {line}"
    options = line[len(command_a):]
    for option in ("--backend ${{ matrix.backend }}", "--world-size ${{ matrix.world-size }}",
                   "--backend-plugin {0}", "--report-dir reports/out"):
        assert option in options, option


def test_the_project_tests_job_runs_ci_run_which_runs_command_b():
    assert ".ci/run" in run_lines(workflow())
    _, command_b = _quickstart_commands()
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as fh:
        assert command_b in [line.strip() for line in fh]


def test_matrix_covers_the_backends_and_uploads_the_report_folder():
    text = workflow()
    registry = BackendRegistry([])
    backends = matrix_list(text, "backend")
    assert backends == ["gloo", "reference", "native"]
    assert all(registry.get(name).name == name for name in backends)  # names the suite knows
    assert [int(n) for n in matrix_list(text, "world-size")] == [2, 3]
    assert "uses: actions/upload-artifact@v4" in text and re.search(r"path:\s*reports/out/?\s*$", text, re.M)
    assert "if: always()" in text  # a failing run's report is the one people need


def test_readme_shows_how_a_vendor_joins_the_matrix():
    with open(os.path.join(REPO_ROOT, "README.md")) as fh:
        readme = fh.read()
    assert ".github/workflows/conformance.yml" in readme
    section = readme.split("## Continuous integration", 1)[1].split("\n## ", 1)[0]
    assert "--backend-plugin" in section and "include:" in section


def test_ci_run_installs_open_mpi_so_the_mpirun_test_runs():
    """tests/test_launch.py::test_mpirun fails under CI when mpirun is missing: .ci/run provides it."""
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as fh:
        script = fh.read()
    assert "apt-get install -y openmpi-bin" in script
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in script  # CI containers run as root
    assert script.index("openmpi-bin") < script.index("-m pytest tests/")
