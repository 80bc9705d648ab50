"""The dcdev test device (native/device/, issue 37): what torch sees of it, and a host read of its memory faults.

Each check runs in a process of its own (tests/harness_cases/dcdev_probe.py): registering a PrivateUse1 device is
for the whole process. The extension is built once (native/device/build.py); a failed build skips with its
first compiler error.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest
from tests.harness_cases import warm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def built() -> None:
    pytest.importorskip("torch")
    from native.device import build

    try:
        build.load()
    except build.BuildFailed as exc:
        pytest.skip(str(exc))


def _probe(what: str) -> subprocess.CompletedProcess:
    return warm.run([sys.executable, "-m", "tests.harness_cases.dcdev_probe", what], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_torch_sees_eight_devices_and_runs_the_clauses_ops(built):
    """torch.accelerator reports dcdev with 8 devices; copies, views, fill_ and the CPU fallback give exact values."""
    proc = _probe("facts")
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts == {
        "accelerator": "dcdev", "available": True, "count": 8, "current": 3, "default_placement": "dcdev:3",
        "round_trip": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "fallback": [1.0, 3.0, 5.0, 7.0, 9.0, 11.0],
        "fallback_device": "dcdev:2", "column": [5.0, 5.0, 5.0], "column_is_view": True,
        "device_to_device": ["dcdev:4", 60.0], "item": 60.0, "empty": [],
    }


def test_a_host_read_of_device_memory_faults(built):
    """Device memory is PROT_NONE outside the device's own kernels: reading it from the host is a SIGSEGV."""
    proc = _probe("host_read")
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "read" not in proc.stdout


def test_build_folder_is_keyed_by_torch_and_sources_and_ignored(tmp_path, monkeypatch):
    """native/device/build/<torch version>-<hash>: an edited source gets a fresh build; the folder is git-ignored."""
    import shutil

    torch = pytest.importorskip("torch")
    from native.device import build

    folder = build.build_dir()
    assert folder.parent == build.BUILD_ROOT and folder.name.startswith(f"torch{torch.__version__}-")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(folder)], cwd=ROOT)
    assert ignored.returncode == 0, f"{folder} is not git-ignored"
    for name in build.SOURCES + build.HEADERS:
        shutil.copy(build.HERE / name, tmp_path / name)
    monkeypatch.setattr(build, "HERE", tmp_path)
    assert build.build_dir() == folder, "the key is the sources' content, not where they are"
    with open(tmp_path / "staged.cpp", "a") as fh:
        fh.write("// edited\n")
    assert build.build_dir() != folder, "an edited source must get a fresh build"


def privateuse1_commands() -> list[list[str]]:
    """The pytest arguments of each command of tox.ini's privateuse1 env, as written there (less ``python -m pytest``,
    ``{posargs}`` and the report folder, which the test chooses): the one home of the device's matrix."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(os.path.join(ROOT, "tox.ini"))
    commands = []
    for line in filter(None, map(str.strip, parser["testenv:privateuse1"]["commands"].splitlines())):
        words = [word for word in shlex.split(line) if word != "{posargs}"]
        assert words[:3] == ["python", "-m", "pytest"], f"tox.ini's privateuse1 command is not a pytest run: {line}"
        at = words.index("--report-dir")
        commands.append(words[3:at] + words[at + 2:])
    return commands


def _named(args: list[str], option: str, default: str) -> list[str]:
    """The comma-separated values of ``option`` in ``args`` (``default`` when it is absent)."""
    return args[args.index(option) + 1].split(",") if option in args else [default]


MATRIX = privateuse1_commands()


# CI runs the whole of `tox -e privateuse1` (issue 37), a test per command, each one process beside the other tests
# (started first: each is 100-300 s of mostly waiting under CI's load).
@pytest.mark.starts_first(1)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("args", MATRIX, ids=[f"command{i + 1}" for i in range(len(MATRIX))])
def test_the_matrix_runs_on_the_device(built, tmp_path, args):
    """A command of tox -e privateuse1 fails nothing: every area and world size it names runs cases that pass, and every skip and gap says why."""
    from tests.harness_cases.procs import run_pytest

    run = run_pytest([*args, "-q"], tmp_path, timeout=840)
    with open(tmp_path / "conformance.json") as fh:
        cases = json.load(fh)["cases"]
    bad = [f"{c['nodeid']} [{c['outcome']}]: {(c.get('error') or '').splitlines()[:1]}" for c in cases
           if c["outcome"] not in ("passed", "xfailed", "skipped")]
    assert run.returncode == 0 and not bad, "\n".join(bad) + "\n" + run.stdout[-3000:] + run.stderr[-2000:]
    assert all(c["reason"] for c in cases if c["outcome"] in ("skipped", "xfailed")), "a skip or gap without a reason"
    from backends.mixed import is_qualified, parse

    backend = args[args.index("--backend") + 1]
    # a qualified string runs one world per device it names (backends/mixed.py), a backend name one world
    worlds = {f"{backend}@{part.device}" for part in parse(backend)} if is_qualified(backend) else {backend}
    served = {c["backend"] for c in cases}
    assert served == worlds, f"worlds run {sorted(served)}, expected {sorted(worlds)}"
    for area in (arg.split("/")[1] for arg in args if arg.startswith("suites/")):
        for size in map(int, _named(args, "--world-size", "2")):
            passed = [c for c in cases if c["area"] == area and c["world_size"] == size and c["outcome"] == "passed"]
            assert passed, f"no {area} case passed at world size {size}"
        eager = [c["nodeid"] for c in cases if c["area"] == area and "-eager" in c["nodeid"]]
        inits = _named(args, "--init", "lazy")
        assert bool(eager) == ("eager" in inits), f"{area}: {len(eager)} eager cases under --init {','.join(inits)}"


# The device audit on real device tensors (tests/test_device_audit.py tags CPU tensors as a stand-in device): the
# planted clauses, each handing torch.distributed a tensor off the rank's device in its own way; on dcdev each must
# fail in its own collective (torch finds no backend for the tensor's device), and their good twin must pass.
PLANTED = "tests/harness_cases/device_planted.py"
PLANTED_BAD = ("test_bad_hard_coded_cpu", "test_bad_device_string", "test_bad_default_device")


def test_planted_off_device_clauses_fail_on_the_device(built, tmp_path):
    """Clauses that hand a collective a tensor off the rank's dcdev device fail in that collective; their good twin passes."""
    from tests.harness_cases.procs import run_pytest

    run = run_pytest([PLANTED, "--backend-plugin", "native.device", "--backend", "native-dcdev",
                      "--world-size", "2", "--init", "eager", "-q"], tmp_path, timeout=240)
    with open(tmp_path / "conformance.json") as fh:
        planted = {c["nodeid"].split("::")[1].split("[")[0]: c for c in json.load(fh)["cases"]}
    for name in PLANTED_BAD:
        assert planted[name]["outcome"] == "failed" and "device type cpu" in planted[name]["error"], \
            f"{name} handed a collective a CPU tensor on a dcdev rank: {planted[name]['outcome']} {planted[name]['error']!r}"
    assert planted["test_good_rank_device"]["outcome"] == "passed", (planted["test_good_rank_device"]["error"],
                                                                      run.stdout[-2000:])
