"""The dcdev test device (native/device/, issue 37): what torch sees of it, and a host read of its memory faults.

Each check runs in a process of its own (tests/harness_cases/dcdev_probe.py): registering a PrivateUse1 device is
for the whole process. The extension is built once (native/device/build.py); a failed build skips with its
first compiler error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

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
    return subprocess.run([sys.executable, "-m", "tests.harness_cases.dcdev_probe", what], cwd=ROOT,
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


# The bounded form of `tox -e privateuse1` that CI runs (issue 37): the clauses a vendor's first run meets, on
# native-dcdev at world size 2 with eager init (device_id=dcdev:<rank>), RPC's device maps with every agent
# included. The whole matrix is `tox -e privateuse1`.
PRIVATEUSE1_SLICE = ("suites/c10d/test_all_reduce.py", "suites/c10d/test_registration.py",
                     "suites/c10d/test_flight_recorder.py", "suites/p2p/test_send_recv.py", "suites/ddp/test_gradients.py",
                     "suites/rpc/test_device_maps.py")


# The device audit on real device tensors (tests/test_device_audit.py tags CPU tensors as a stand-in device): the
# planted clauses, each handing torch.distributed a tensor off the rank's device in its own way, run beside the
# slice; on dcdev each must fail in its own collective (torch finds no backend for the tensor's device), and
# their good twin must pass.
PLANTED = "tests/harness_cases/device_planted.py"
PLANTED_BAD = ("test_bad_hard_coded_cpu", "test_bad_device_string", "test_bad_default_device")


@pytest.mark.starts_first(2)  # 40 to 90 s: a pytest run of its own with a world of two ranks on the device
def test_the_contract_runs_on_the_device(built, tmp_path):
    """A slice of the contract passes on native-dcdev with tensors on dcdev:<rank>, every case run, none skipped silently; the planted off-device clauses fail."""
    from tests.harness_cases.procs import run_pytest

    run = run_pytest([*PRIVATEUSE1_SLICE, PLANTED, "--backend-plugin", "native.device", "--backend", "native-dcdev",
                      "--world-size", "2", "--init", "eager", "-q"], tmp_path, timeout=480)
    with open(tmp_path / "conformance.json") as fh:
        cases = json.load(fh)["cases"]
    planted = {c["nodeid"].split("::")[1].split("[")[0]: c for c in cases if c["nodeid"].startswith(PLANTED)}
    for name in PLANTED_BAD:
        assert planted[name]["outcome"] == "failed" and "device type cpu" in planted[name]["error"], \
            f"{name} handed a collective a CPU tensor on a dcdev rank: {planted[name]['outcome']} {planted[name]['error']!r}"
    assert planted["test_good_rank_device"]["outcome"] == "passed", planted["test_good_rank_device"]["error"]
    cases = [c for c in cases if not c["nodeid"].startswith(PLANTED)]
    outcomes = {c["outcome"] for c in cases}
    assert {c["backend"] for c in cases} == {"native-dcdev"} and outcomes <= {"passed", "xfailed", "skipped"}, \
        run.stdout[-4000:] + run.stderr[-2000:]
    assert sum(c["outcome"] == "passed" for c in cases) >= 200, f"{len(cases)} cases: {outcomes}"
    assert all(c["reason"] for c in cases if c["outcome"] in ("skipped", "xfailed")), "a skip or gap without a reason"
