"""The CI workflow runs the README's commands: a job per (backend, world size) and the project's own tests.

Both commands begin with ``bash .ci/setup``, the one set-up (venv, requirements.txt, and for the project's tests
the Debian packages); its behaviour is checked here on a copy of the script with stand-in pip, apt-get and
pytest, so no test here installs anything.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_docs_show_how_a_vendor_joins_the_matrix():
    with open(os.path.join(REPO_ROOT, "README.md")) as fh:
        readme = fh.read()
    assert ".github/workflows/conformance.yml" in readme and "docs/contract.md#continuous-integration" in readme
    with open(os.path.join(REPO_ROOT, "docs", "contract.md")) as fh:
        section = fh.read().split("## Continuous integration", 1)[1].split("\n## ", 1)[0]
    assert ".github/workflows/conformance.yml" in section
    assert "--backend-plugin" in section and "include:" in section


def test_ci_run_installs_open_mpi_so_the_mpirun_test_runs():
    """tests/test_launch_launchers.py::test_mpirun fails under CI when mpirun is missing: .ci/run provides it."""
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as fh:
        script = fh.read()
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in script  # CI containers run as root
    assert script.index("OMPI_ALLOW_RUN_AS_ROOT") < script.index("-m pytest tests/")
    assert "bash .ci/setup tests &&" in script
    with open(os.path.join(REPO_ROOT, ".ci", "setup")) as fh:
        assert "openmpi-bin" in fh.read()


# ------------------------------------------------------------ .ci/setup and .ci/run, on a stand-in checkout
SETUP = os.path.join(REPO_ROOT, ".ci", "setup")
STAMP = ".venv/.distconform-requirements.sha256"


def stand_in(path: Path, script: str) -> None:
    # a stand-in replaces what is there, never writes through it: system_path links real tools (python3 is a pyenv
    # shim here), and writing to the link once rewrote the machine's python3
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def checkout(tmp_path: Path) -> Path:
    """A repo root holding .ci/setup and .ci/run, requirements.txt and an existing .venv whose pip logs its calls."""
    root = tmp_path / "repo"
    (root / ".ci").mkdir(parents=True)
    for name in ("setup", "run"):
        shutil.copy(os.path.join(REPO_ROOT, ".ci", name), root / ".ci" / name)
    (root / "requirements.txt").write_text("torch==2.13.0\n")
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    stand_in(venv_bin / "pip", f'echo "pip $*" >> "{tmp_path}/calls"; exit ${{PIP_RC:-0}}\n')
    return root


def system_path(tmp_path: Path, **commands: str) -> str:
    """A PATH with only the basic tools .ci/setup uses and the given stand-ins (no chromium, mpirun, apt-get)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("dirname", "id", "cat", "python3", "bash"):
        found = shutil.which(tool)
        assert found, f"{tool} is not installed"
        (bin_dir / tool).symlink_to(found)
    for name, script in commands.items():
        stand_in(bin_dir / name, script)
    return str(bin_dir)


def setup(root: Path, *args: str, path: str = "", **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env, **({"PATH": path} if path else {})}
    return subprocess.run(["bash", str(root / ".ci" / "setup"), *args], env=environ, capture_output=True,
                          text=True, timeout=60)


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls"
    return log.read_text().splitlines() if log.exists() else []


def test_setup_installs_requirements_once_and_again_only_when_they_change(tmp_path):
    root = checkout(tmp_path)
    assert setup(root).returncode == 0
    assert calls(tmp_path) == ["pip install -q -r requirements.txt"]
    assert (root / STAMP).exists()
    assert setup(root, "suites").returncode == 0 and setup(root, "suites").returncode == 0
    assert len(calls(tmp_path)) == 1  # unchanged requirements.txt: pip is not run again
    (root / "requirements.txt").write_text("torch==2.13.0\nnumpy\n")
    assert setup(root).returncode == 0
    assert len(calls(tmp_path)) == 2


def test_setup_fails_when_pip_fails_and_tries_again_next_time(tmp_path):
    root = checkout(tmp_path)
    failed = setup(root, PIP_RC="1")
    assert failed.returncode == 1 and "pip install -r requirements.txt failed" in failed.stderr
    assert not (root / STAMP).exists()
    assert setup(root).returncode == 0 and len(calls(tmp_path)) == 2


def test_setup_refuses_an_unknown_target(tmp_path):
    refused = setup(checkout(tmp_path), "everything")
    assert refused.returncode == 2 and "usage: bash .ci/setup [suites|tests]" in refused.stderr


def test_setup_for_the_tests_installs_the_missing_debian_packages_or_says_what_it_cannot(tmp_path):
    root = checkout(tmp_path)
    path = system_path(tmp_path, **{"apt-get": f'echo "apt-get $*" >> "{tmp_path}/calls"\n', "c++": ""})
    done = setup(root, "tests", path=path)
    assert done.returncode == 0, done.stderr
    if os.getuid() == 0:
        assert calls(tmp_path)[:2] == ["apt-get update -qq", "apt-get install -y -qq chromium openmpi-bin nftables"]
    else:
        assert not any(c.startswith("apt-get") for c in calls(tmp_path))
        assert "cannot install chromium openmpi-bin nftables here (needs root and apt-get)" in done.stderr
        assert "tests/test_report_html.py fails" in done.stderr and "test_mpirun skips" in done.stderr
    assert setup(root, "suites", path=path).stderr == ""  # the conformance suite needs neither package


def test_setup_says_what_fails_when_apt_get_fails(tmp_path):
    if os.getuid() != 0:
        import pytest

        pytest.skip("only root may apt-get: the non-root message is checked by the test above")
    root = checkout(tmp_path)
    path = system_path(tmp_path, **{"apt-get": "exit 100\n", "c++": ""})
    done = setup(root, "tests", path=path)
    assert done.returncode == 0  # the venv is set up; the missing packages cost only their tests
    assert "apt-get install chromium openmpi-bin nftables failed" in done.stderr
    assert "tests/test_report_html.py fails (no headless Chromium)" in done.stderr


@pytest.mark.parametrize("pytest_rc", [0, 1])
def test_ci_run_runs_setup_then_pytest_and_fails_when_pytest_fails(tmp_path, pytest_rc):
    root = checkout(tmp_path)
    (root / ".venv" / "bin" / "python").unlink()
    stand_in(root / ".venv" / "bin" / "python",
             f'echo "python $* OMPI=${{OMPI_ALLOW_RUN_AS_ROOT:-}}" >> "{tmp_path}/calls"; exit {pytest_rc}\n')
    (root / STAMP).write_text("stale\n")
    ran = subprocess.run([str(root / ".ci" / "run")], env={**os.environ, "PATH": system_path(tmp_path, **{"c++": ""}),
                                                           "DISTCONFORM_TORCH_LANE": ""},
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == pytest_rc, ran.stderr
    # the native build runs in the background beside the tests, so its call may land before or after pytest's
    made = [c for c in calls(tmp_path) if not c.startswith("python -c import native.build")]
    assert made[-1] == "python -m pytest tests/ OMPI=" + ("1" if os.getuid() == 0 else ""), made


def test_ci_run_fails_without_running_pytest_when_setup_fails(tmp_path):
    root = checkout(tmp_path)
    (root / ".venv" / "bin" / "python").unlink()
    stand_in(root / ".venv" / "bin" / "python", f'echo "python $*" >> "{tmp_path}/calls"\n')
    (root / STAMP).write_text("stale\n")  # so setup runs pip, which fails
    ran = subprocess.run([str(root / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PIP_RC": "1", "PATH": system_path(tmp_path, **{"c++": ""}),
                              "DISTCONFORM_TORCH_LANE": ""})
    assert ran.returncode == 1, ran.stderr
    assert "pip install -q -r requirements.txt" in calls(tmp_path)
    assert not [c for c in calls(tmp_path) if "-m pytest" in c], calls(tmp_path)


def test_ci_runs_one_other_torch_release_through_its_tox_env():
    """Issue 23: CI runs the bounded torch-release lane, tox.ini's env for the release .ci/run names."""
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as fh:
        run = fh.read()
    release = re.search(r"DISTCONFORM_TORCH_LANE-(\d+)", run).group(1)
    with open(os.path.join(REPO_ROOT, "tox.ini")) as fh:
        assert f"[testenv:torch{release}]" in fh.read()
    assert 'tox -e "torch$lane"' in run


@pytest.mark.parametrize("lane_rc, pytest_rc, expect", [(0, 0, 0), (3, 0, 3), (3, 1, 1), (0, 1, 1)])
def test_the_lane_runs_beside_the_project_tests_and_either_failing_fails_the_run(tmp_path, lane_rc, pytest_rc, expect):
    """The project's tests start while the lane still runs; the run waits for both and fails when either failed."""
    root = checkout(tmp_path)
    (root / ".venv" / "bin" / "python").unlink()
    stand_in(root / ".venv" / "bin" / "python", f'[ "$1" = -m ] || exec {sys.executable} "$@"\n'
                                                f'echo "pytest $*" >> "{tmp_path}/calls"; exit {pytest_rc}\n')
    (root / STAMP).write_text(hashlib.sha256((root / "requirements.txt").read_bytes()).hexdigest() + "\n")
    # python3 -m venv .tox/.runner makes the lane's tox: it lasts a second, then ends with lane_rc
    lane_python = (f'#!/bin/sh\ncase "$*" in "-m tox "*) sleep 1; echo "lane done" >> "{tmp_path}/calls"; exit {lane_rc};; '
                   f'esac\nexit 0\n')
    venv = (f'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && printf \'%s\' \'{lane_python}\' > "$3/bin/python" '
            f'&& chmod +x "$3/bin/python"; exit 0; fi\nexec {sys.executable} "$@"\n')
    tools = {name: f'exec {shutil.which(name)} "$@"\n' for name in ("mkdir", "chmod", "sleep")}
    ran = subprocess.run([str(root / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": system_path(tmp_path, **tools, **{"c++": ""}, python3=venv),
                              "DISTCONFORM_CI_CACHE": "", "DISTCONFORM_TORCH_LANE": "2141"})
    assert ran.returncode == expect, ran.stderr
    assert calls(tmp_path) == ["pytest -m pytest tests/", "lane done"], "the tests waited for the lane"
    assert ("the torch2141 lane failed" in ran.stderr) == (lane_rc != 0), ran.stderr


def test_ci_run_keeps_the_native_build_in_a_cache_outside_the_clone(tmp_path):
    """A finished native build is saved after the tests and restored into the next fresh clone; a failed one is not."""
    cache = tmp_path / "cache"
    tools = {name: f'exec {shutil.which(name)} "$@"\n' for name in ("mkdir", "cp", "mv", "rm", "basename", "head",
                                                                     "cksum", "cut")}
    path = system_path(tmp_path, **tools, **{"c++": "echo 'c++ (stand-in) 1.0'\n"})
    folder = "native/build/torch2.13.0+cpu-0123456789ab"

    def ci_run(root: Path, builds: str) -> subprocess.CompletedProcess:
        """.ci/run whose pytest logs whether the build was there, then leaves `builds` (a script) behind."""
        (root / ".venv" / "bin" / "python").unlink()
        stand_in(root / ".venv" / "bin" / "python",  # only `-m pytest` is stood in for; .ci/setup's -c is real
                 f'[ "$1" = -m ] || exec {sys.executable} "$@"\n'
                 f'[ -f {folder}/distconform_native.so ] && echo restored >> "{tmp_path}/calls"\n{builds}\n')
        (root / STAMP).write_text(hashlib.sha256((root / "requirements.txt").read_bytes()).hexdigest() + "\n")
        return subprocess.run([str(root / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PATH": path, "DISTCONFORM_TORCH_LANE": "",
                                   "DISTCONFORM_CI_CACHE": str(cache)})

    failed_build = f"mkdir -p {folder}"  # a folder without the library: a build that failed
    first = ci_run(checkout(tmp_path / "one"), failed_build)
    assert first.returncode == 0, first.stderr
    cut_off = ci_run(checkout(tmp_path / "cut"), f"{failed_build} && echo so > {folder}/distconform_native.so")
    assert cut_off.returncode == 0, cut_off.stderr
    assert not list(cache.glob("native/*/torch*")), "a failed or cut-off build (no build-seconds) must not be saved"

    second = ci_run(checkout(tmp_path / "two"), f"{failed_build} && echo so > {folder}/distconform_native.so"
                                                f" && echo 50.4 > {folder}/build-seconds")
    assert second.returncode == 0, second.stderr
    saved = list(cache.glob("native/*/torch*"))
    assert [p.name for p in saved] == ["torch2.13.0+cpu-0123456789ab"] and (saved[0] / "distconform_native.so").exists()
    assert calls(tmp_path) == []  # neither run found a build before its tests

    third_root = checkout(tmp_path / "three")
    third = ci_run(third_root, "exit 1")
    assert third.returncode == 1, "the tests' status stays the run's"
    assert calls(tmp_path) == ["restored"]
    assert (third_root / folder / "distconform_native.so").read_text() == "so\n"


def test_ci_run_keeps_the_torch_release_env_outside_the_clone():
    """The lane's tox env (gigabytes of torch) lives in the cache, so a fresh clone does not unpack torch again."""
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as fh:
        run = fh.read()
    assert 'tox -e "torch$lane" --workdir "$cache/tox" -- -n 0' in run  # the lane's suite runs in one process each
    assert 'flock "$cache/tox/.lock"' in run  # two runs on one machine do not build the env at once
