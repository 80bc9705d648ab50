"""The native backend's own promises, beyond the contract the suites check.

* Life cycle: ``destroy_process_group`` leaves no thread, mapping, shared
  memory name or file descriptor behind, and the segment's name is gone from
  /dev/shm as soon as the group exists (so a rank killed at any point leaves
  nothing behind either).
* A dead peer: a rank whose process is killed in the middle of a collective,
  a barrier, a receive or a send makes every survivor's call fail within a few
  seconds (the group timeout is a minute), naming the dead rank; the
  survivors can still destroy the group, and nothing is left in /dev/shm.
* Its own flight recorder (torch's cannot be recorded into from an extension):
  one entry per collective and p2p call, "completed" once its Work finished
  (failed too), bounded by TORCH_FR_BUFFER_SIZE (0: off).
* Build: a compiler error becomes one line naming the first error, reported
  as the backend's unavailability, and is not retried per case. One build
  serves the real backend and every seeded bug: the bug is planted at run
  time (create's planted_bug), and an unknown name is refused naming the
  known ones.

The life-cycle test builds the extension if this checkout never did (once,
a few minutes on a small machine; native/build.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness_cases.native_ranks import SEGMENT_PREFIX

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("size", ["2000", "1", "0"])
def test_own_flight_recorder_records_every_call(tmp_path, size):
    """native's own recorder (native/recorder.hpp): one entry per collective and p2p call with torch's fields, every
    waited call "completed" (a failed one retired in its state "started", and counted in pg_status as torch's
    recorders count it), pg_status and pg_config per group; TORCH_FR_BUFFER_SIZE bounds the
    ring (1: the last entry only) and 0 turns it off."""
    pytest.importorskip("torch")
    _built()
    results = _run_ranks(tmp_path, 2, "recorder_rank", size)
    seen = []
    for rank, (code, output, _) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-3000:]}"
        with open(tmp_path / f"rank{rank}.json") as fh:
            seen.append(json.load(fh))
    assert seen[0]["error"] and "timed out" in seen[0]["error"], seen[0]["error"]
    short = seen[0]["short"]
    if size == "0":
        assert all(s["json"]["entries"] == [] for s in seen), [s["json"]["entries"] for s in seen]
        return
    dump = seen[0]["json"]
    if size == "1":  # the ring holds the newest entry only: rank 0's failed all_reduce
        (entry,) = dump["entries"]
        assert (entry["profiling_name"], entry["process_group"][0], entry["state"]) == \
            ("native:all_reduce", short, "started") and entry["retired"] and entry["record_id"] > 0, entry
        return
    default = [e for e in dump["entries"] if e["process_group"] == ["0", "default_pg"]][-3:]
    assert [e["profiling_name"] for e in default] == ["native:all_reduce", "native:broadcast", "native:send 0->1"]
    reduce, bcast, send = default
    assert (reduce["input_sizes"], reduce["input_dtypes"], bcast["output_sizes"], bcast["output_dtypes"]) == \
        ([[4]], ["Float"], [[2, 3]], ["Long"])
    assert bcast["collective_seq_id"] == reduce["collective_seq_id"] + 1
    assert (send["is_p2p"], send["p2p_seq_id"], send["collective_seq_id"]) == (True, 1, bcast["collective_seq_id"])
    (recv,) = [e for e in seen[1]["json"]["entries"] if e["is_p2p"]]
    assert (recv["profiling_name"], recv["p2p_seq_id"]) == ("native:recv 1<-0", 1)
    (failed,) = [e for e in dump["entries"] if e["process_group"][0] == short]
    assert failed["collective_seq_id"] == 1 and failed["timeout_ms"] == 500
    assert failed["state"] == "started" and failed["retired"] and not failed["time_discovered_completed_ns"], failed
    for entry in dump["entries"] + seen[1]["json"]["entries"]:
        if entry is not failed:
            assert entry["state"] == "completed" and entry["retired"] and entry["time_discovered_completed_ns"] > 0, entry
    assert dump["pg_status"][short] == {"last_enqueued_collective": "1", "last_started_collective": "1",
                                        "last_completed_collective": "1"}
    assert dump["pg_config"]["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}
    assert dump["pg_config"][short]["ranks"] == "[0, 1]"
    assert seen[0]["pickled_types"] == ["int", "tuple"]  # torch's pickled form: a tuple group, numbers as ints


def _run_ranks(tmp_path, world_size: int, function: str, *args, timeout: float = 180) -> list:
    """Start ``world_size`` rank processes running ``tests.harness_cases.native_ranks.<function>``; their (returncode, output, pid)."""
    procs = []
    for rank in range(world_size):
        code = (f"import sys; from tests.harness_cases.native_ranks import {function}; "
                f"{function}(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:-1], sys.argv[-1])")
        procs.append(subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "store"), str(rank), str(world_size), *map(str, args),
             str(tmp_path / f"rank{rank}.json")], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"the ranks did not finish within {timeout:g} s")
        outputs.append((proc.returncode, out.decode(errors="replace"), proc.pid))
    return outputs


def _built() -> None:
    from native import build

    try:
        build.load()  # build here, not inside the timed ranks
    except build.BuildFailed as exc:
        pytest.fail(f"the native extension does not build: {exc}")


@pytest.mark.parametrize("scenario, world_size", [("all_reduce", 3), ("barrier", 3), ("recv", 2), ("send", 2)])
def test_dead_peer_fails_the_survivors_fast_naming_it(tmp_path, scenario, world_size):
    """A rank killed mid-collective/barrier/recv/send: every survivor fails within seconds, naming it; no segment left."""
    pytest.importorskip("torch")
    _built()
    victim = world_size - 1
    results = _run_ranks(tmp_path, world_size, "dead_peer_rank", scenario, victim)
    assert results[victim][0] == -9, f"the victim was to be killed, it exited {results[victim][0]}"
    for rank in range(world_size):
        if rank == victim:
            continue
        code, output, _ = results[rank]
        assert code == 0, f"rank {rank} exited {code}:\n{output[-3000:]}"
        with open(tmp_path / f"rank{rank}.json") as fh:
            seen = json.load(fh)
        assert seen["error"], f"rank {rank}: no call failed after rank {victim} was killed"
        assert f"group ranks [{victim}]" in seen["error"] and "died" in seen["error"], seen["error"]
        # the group timeout is 60 s; liveness is checked every 50 ms while a rank sleeps
        assert seen["elapsed"] < 10, f"rank {rank} noticed the death after {seen['elapsed']:.1f} s: {seen['error']}"
        assert seen["after"]["native_threads"] == [] and seen["after"]["maps"] == [], seen["after"]
        # the segment's name carries the pid of the rank that created it (rank 0); other groups may live here
        ours = [name for name in seen["after"]["shm"] if name.startswith(f"{SEGMENT_PREFIX}{results[0][2]}-")]
        assert ours == [], f"names left in /dev/shm: {ours}"


def test_destroy_leaves_no_thread_segment_or_fd(tmp_path):
    """After destroy_process_group a rank has no native thread, mapping, /dev/shm name or extra fd."""
    pytest.importorskip("torch")
    from native import build

    try:
        build.load()  # build here, not inside the timed ranks
    except build.BuildFailed as exc:
        pytest.fail(f"the native extension does not build: {exc}")
    world_size = 2
    procs = []
    for rank in range(world_size):
        code = ("import sys; from tests.harness_cases.native_ranks import lifecycle_rank; "
                "lifecycle_rank(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")
        procs.append(subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "store"), str(rank), str(world_size),
             str(tmp_path / f"rank{rank}.json")], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the life-cycle ranks did not finish within 180 s")
        outputs.append(out.decode(errors="replace"))
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{outputs[rank][-3000:]}"
    # segment names carry the creating rank's pid: other tests' groups (pytest-xdist workers, a seeded bug's
    # killed ranks) may have names in /dev/shm at the same time, and only ours are this test's business
    pids = {proc.pid for proc in procs}

    def ours(names: list) -> list:
        return [name for name in names if any(name.startswith(f"{SEGMENT_PREFIX}{pid}-") for pid in pids)]

    for rank in range(world_size):
        with open(tmp_path / f"rank{rank}.json") as fh:
            seen = json.load(fh)
        before, during, after = seen["before"], seen["during"], seen["after"]
        during["shm"], after["shm"] = ours(during["shm"]), ours(after["shm"])
        # the probe sees what it looks for: two groups, each a worker and a p2p thread and one mapping
        assert during["native_threads"] == ["native-p2p"] * 2 + ["native-worker"] * 2, during
        assert len(during["maps"]) == 2, during["maps"]
        # the name is unlinked as soon as every rank mapped the segment
        assert during["shm"] == [], f"rank {rank}: segment names left in /dev/shm while the group lives: {during['shm']}"
        assert after["native_threads"] == [], f"rank {rank}: threads left after destroy: {after['native_threads']}"
        assert after["maps"] == [], f"rank {rank}: segments still mapped after destroy: {after['maps']}"
        assert after["shm"] == [], f"rank {rank}: names left in /dev/shm: {after['shm']}"
        leaked = sorted(set(after["fds"]) - set(before["fds"]), key=int)
        assert not leaked, f"rank {rank}: file descriptors opened by the group and never closed: {leaked}"
        assert seen["sum"] == 2.0 * (1 << 16)


COMPILER_OUTPUT = """Error building extension 'distconform_native_clean': [1/5] c++ -MMD -MF segment.o.d ... -c segment.cpp -o segment.o
FAILED: segment.o
c++ -MMD -MF segment.o.d -DTORCH_EXTENSION_NAME=distconform_native_clean -O3 -c /x/native/segment.cpp -o segment.o
In file included from /x/native/segment.cpp:17:
/x/native/segment.cpp:212:5: error: 'roundd' was not declared in this scope; did you mean 'round'?
  212 |     roundd(fp);
/x/native/segment.cpp:230:1: error: expected ';' before '}' token
ninja: build stopped: subcommand failed.
"""


def test_failed_build_is_one_line_reason_reported_once(tmp_path, monkeypatch):
    """A compiler error makes the backend unavailable with the first error line, and is not retried."""
    pytest.importorskip("torch")
    from torch.utils import cpp_extension

    import native
    from native import build

    calls = []

    def failing_load(**kwargs):
        calls.append(kwargs["name"])
        raise RuntimeError(COMPILER_OUTPUT)

    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path)
    monkeypatch.setattr(build.NATIVE, "_loaded", None)
    monkeypatch.setattr(build.NATIVE, "_failed", None)
    monkeypatch.setattr(cpp_extension, "load", failing_load)
    spec = native.register("native_broken_build", "skip_last_rank")
    clean = native.register("native_broken_build_clean")
    first = spec.availability()
    second = spec.availability()
    assert not first.available
    assert first.reason == ("native build failed: /x/native/segment.cpp:212:5: error: 'roundd' was not declared "
                            "in this scope; did you mean 'round'?")
    assert "\n" not in first.reason
    assert second == first
    assert clean.availability() == first, "the clean backend and the planted bugs share one build"
    assert calls == ["distconform_native"], "a failed build must be remembered, not retried per case"


def test_one_build_folder_keyed_by_torch_version_and_sources(tmp_path, monkeypatch):
    """One folder for the clean backend and every planted bug; a new torch or an edited source gets a new one."""
    import shutil

    import torch

    from native import build

    folder = build.build_dir()
    assert folder.parent == build.BUILD_ROOT
    assert folder.name.startswith(f"torch{torch.__version__}-")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(folder)], cwd=REPO_ROOT)
    assert ignored.returncode == 0, f"{folder} is not git-ignored"
    for name in build.SOURCES + build.HEADERS:
        shutil.copy(build.HERE / name, tmp_path / name)
    monkeypatch.setattr(build, "HERE", tmp_path)
    assert build.build_dir() == folder, "the key is the sources' content, not where they are"
    with open(tmp_path / "p2p.cpp", "a") as fh:
        fh.write("// edited\n")
    assert build.build_dir() != folder, "an edited source must get a fresh build"


def test_planted_bug_is_chosen_at_run_time_and_unknown_names_are_refused():
    """create(planted_bug=...) plants a known bug for the process; an unknown name fails naming the known ones."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    import native

    _built()
    extension = native.build.load()
    assert extension.PLANTED_BUGS[0] == "none"
    seeded = {name[len("native_"):-len(".py")] for name in os.listdir(os.path.join(REPO_ROOT, "tests", "seeded"))
              if name.startswith("native_") and name.endswith(".py") and name != "native_base.py"}
    assert seeded == set(extension.PLANTED_BUGS[1:]), \
        "every planted bug has its seeded module (tests/seeded/native_<bug>.py) and nothing else is planted"
    known = ", ".join(repr(name) for name in extension.PLANTED_BUGS)
    with pytest.raises(ValueError, match=f"^native: unknown planted bug 'no_such_bug'; known: {known}$"):
        extension.create(dist.HashStore(), 0, 1, 5.0, [0], planted_bug="no_such_bug")
    refused = native.register("native_no_such_bug", "no_such_bug").availability()
    assert not refused.available
    assert refused.reason == f"native: unknown planted bug 'no_such_bug'; known: {known}"
    try:
        group = extension.create(dist.HashStore(), 0, 1, 5.0, [0], planted_bug="premul_first_only")
        assert extension.planted_bug() == "premul_first_only"
        del group
    finally:
        extension.create(dist.HashStore(), 0, 1, 5.0, [0])  # back to the real backend for this process
    assert extension.planted_bug() == "none"
