"""fixtures/gpu_check.py: the GPU lane's one command, checked on CPU (plan, verdicts, exit codes, a real dry run)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from fixtures import gpu_check
from fixtures.gpu_check import (EXIT_FAILED, EXIT_NO_GPU, EXIT_PASSED, STEPS, Verdict, bench_verdict, main,
                                pytest_verdict, run_step)
from tests.harness_cases import warm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plan(capsys, gpus: int) -> str:
    assert main(["--plan"], count_gpus=lambda: gpus) == EXIT_PASSED
    return capsys.readouterr().out


@pytest.mark.parametrize("gpus, nccl_sizes", [(1, "1"), (2, "1,2"), (8, "1,2,3,8")])
def test_plan_lists_every_step_at_the_world_sizes_the_gpus_allow(capsys, gpus, nccl_sizes):
    out = _plan(capsys, gpus)
    assert f"for {gpus} GPU(s)" in out
    for step in STEPS:
        assert f"- {step.name}: " in out
    assert f"pytest suites/ --backend nccl --world-size {nccl_sizes} " in out
    assert "--backend gloo-cuda --world-size 2,3 " in out  # ranks share GPUs: 2 and 3 ranks on any count
    assert "suites/ddp suites/parallel --backend gloo-cuda" in out
    assert "suites/dist_autograd/test_remote_module.py" in out
    assert f"suites.stress.collectives --backend nccl --world-size {gpus} " in out
    assert "--min-bytes 8 --max-bytes 64M" in out
    assert f"suites/c10d/test_work.py --backend cpu:gloo,cuda:nccl --world-size {nccl_sizes} " in out
    for step in STEPS:  # every step has its own report directory
        if not step.unsupported:
            assert f"--report-dir reports/out/gpu-check/{step.name}" in out


def test_plan_timeouts_fit_the_lanes_budget():
    """Six minutes, and 40 s more for nccl2's step, which only a torch 2.14 image runs (the device lends 15)."""
    assert sum(step.timeout_s for step in STEPS) <= 6 * 60 + 40


def test_no_gpu_says_so_and_exits_3(capsys):
    assert main([], count_gpus=lambda: 0) == EXIT_NO_GPU
    out = capsys.readouterr().out
    assert "no CUDA GPU on this machine" in out and "nothing ran" in out


def _conformance(tmp_path, totals: dict) -> str:
    (tmp_path / "conformance.json").write_text(json.dumps({"meta": {}, "totals": totals, "cases": []}))
    return str(tmp_path)


@pytest.mark.parametrize("totals, rc, status", [
    ({"passed": 5, "skipped": 2, "xfailed": 1}, 0, "passed"),
    ({"passed": 5, "failed": 1}, 1, "failed"),
    ({"passed": 5, "error": 1}, 1, "failed"),
    ({"passed": 5, "xpassed": 1}, 1, "failed"),
    ({"passed": 5}, 1, "failed"),  # pytest said no even though every case passed (e.g. a usage error)
    ({}, 0, "failed"),  # nothing ran
])
def test_verdict_is_read_from_conformance_json(tmp_path, totals, rc, status):
    verdict = pytest_verdict("nccl", rc, _conformance(tmp_path, totals))
    assert verdict.status == status
    for outcome, n in totals.items():
        assert f"{n} {outcome}" in verdict.detail


def test_missing_report_fails_the_step(tmp_path):
    verdict = pytest_verdict("nccl", 0, str(tmp_path))
    assert verdict.failed and "no readable conformance.json" in verdict.detail


def test_bench_verdict_prints_the_rows(tmp_path):
    rows = [{"backend": "nccl", "world_size": 1, "collective": "all_reduce", "size": size, "time_us": 9.5,
             "algbw": 1.25, "busbw": 0.0, "#wrong": 0} for size in (8, 64 << 20)]
    (tmp_path / "collectives.json").write_text(json.dumps({"records": rows, "errors": [], "unavailable": []}))
    verdict = bench_verdict("bench", 0, str(tmp_path))
    assert verdict.status == "passed"
    assert "nccl ws1 all_reduce 8 B" in verdict.detail and f"{64 << 20} B" in verdict.detail
    (tmp_path / "collectives.json").write_text(json.dumps({"records": rows, "errors": ["hang"], "unavailable": []}))
    assert bench_verdict("bench", 1, str(tmp_path)).failed


@pytest.mark.parametrize("verdicts, code", [
    (["passed", "passed"], EXIT_PASSED),
    (["passed", "not supported"], EXIT_PASSED),
    (["passed", "failed"], EXIT_FAILED),
    (["timed out", "passed"], EXIT_FAILED),
])
def test_exit_status_is_non_zero_on_any_failure(monkeypatch, capsys, verdicts, code):
    given = iter(verdicts)
    monkeypatch.setattr(gpu_check, "run_step",
                        lambda step, *args: Verdict(step.name, next(given), "detail"))
    assert main(["--only", "nccl,bench"], count_gpus=lambda: 1) == code
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == ("gpu-check: PASSED" if code == EXIT_PASSED else
                                    f"gpu-check: FAILED: {'nccl' if verdicts[0] != 'passed' else 'bench'}")


def test_a_step_past_its_timeout_fails(monkeypatch, tmp_path):
    def too_slow(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(gpu_check.subprocess, "run", too_slow)
    verdict = run_step(STEPS[0], 1, str(tmp_path), on_cpu=False, time_scale=0.5)
    assert verdict.status == "timed out" and f"after {STEPS[0].timeout_s * 0.5:.0f} s" in verdict.detail


def test_a_step_that_wrote_its_report_but_did_not_exit_says_both(monkeypatch, tmp_path):
    def wrote_then_hung(command, **kwargs):
        (tmp_path / STEPS[0].name / "conformance.json").write_text(json.dumps({"totals": {"passed": 3}}))
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(gpu_check.subprocess, "run", wrote_then_hung)
    verdict = run_step(STEPS[0], 1, str(tmp_path), on_cpu=False)
    assert verdict.status == "timed out" and "its report was written (3 passed)" in verdict.detail


def test_a_dry_run_on_cpu_is_bounded_as_a_hang_not_by_the_gpu_budget(monkeypatch, tmp_path):
    seen = {}

    def record(command, **kwargs):
        seen["timeout"] = kwargs["timeout"]
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(gpu_check.subprocess, "run", record)
    run_step(STEPS[0], 1, str(tmp_path), on_cpu=True)
    assert seen["timeout"] == gpu_check.DRY_RUN_HANG_S
    run_step(STEPS[0], 1, str(tmp_path), on_cpu=False)
    assert seen["timeout"] == STEPS[0].timeout_s


def test_an_earlier_runs_report_never_stands_in_for_a_step_that_wrote_none(monkeypatch, tmp_path):
    (tmp_path / STEPS[0].name).mkdir()
    (tmp_path / STEPS[0].name / "conformance.json").write_text(json.dumps({"totals": {"passed": 3}}))
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(command, 1))
    verdict = run_step(STEPS[0], 1, str(tmp_path), on_cpu=False)
    assert verdict.status == "failed" and "no readable conformance.json" in verdict.detail


def test_unknown_step_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        main(["--only", "nosuch"], count_gpus=lambda: 1)
    assert info.value.code == 2


def test_dry_run_on_cpu_runs_pytest_and_reads_its_report(tmp_path, capsys):
    """The cheapest real run: the nccl step's command on gloo, a -k selection, one process."""
    assert main(["--dry-run-on-cpu", "--only", "nccl", "--report-dir", str(tmp_path)]) == EXIT_PASSED
    out = capsys.readouterr().out
    assert "(dry run on CPU)" in out
    assert "nccl: PASSED: " in out and " passed (pytest exit 0)" in out
    report = json.loads((tmp_path / "nccl" / "conformance.json").read_text())
    assert report["totals"].get("passed", 0) >= 1
    assert {case["backend"] for case in report["cases"]} == {"gloo"}


def test_the_mixed_step_runs_on_cpu_what_its_cpu_device_serves(tmp_path, capsys):
    """--dry-run-on-cpu keeps the mixed string: its CPU world runs gloo's cases, its CUDA world's cases skip
    with the reason (no NCCL or no GPU here), and the step passes."""
    assert main(["--dry-run-on-cpu", "--only", "mixed", "--report-dir", str(tmp_path)]) == EXIT_PASSED
    assert "mixed: PASSED: " in capsys.readouterr().out
    cases = json.loads((tmp_path / "mixed" / "conformance.json").read_text())["cases"]
    by_world = {(case["backend"], case["outcome"]) for case in cases}
    assert by_world == {("cpu:gloo,cuda:nccl@cpu", "passed"), ("cpu:gloo,cuda:nccl@cuda", "skipped")}


def test_the_fault_tolerance_step_says_which_torch_lacks_nccl2(monkeypatch, capsys, tmp_path):
    """On a torch without nccl2 (any before 2.14, this machine's 2.13) the step runs nothing and says why; the
    lane still passes. With a torch that has it, the step runs its pytest on nccl2."""
    ran = []
    monkeypatch.setattr(gpu_check.subprocess, "run",
                        lambda command, **kwargs: ran.append(command) or subprocess.CompletedProcess(command, 0))
    monkeypatch.setattr(gpu_check, "nccl2_missing", lambda: "torch 2.13.0 has no nccl2 (...): nothing ran")
    step = next(s for s in STEPS if s.name == "fault-tolerance")
    step = dataclasses.replace(step, missing=gpu_check.nccl2_missing)
    verdict = run_step(step, 1, str(tmp_path), on_cpu=False)
    assert (verdict.status, verdict.detail, ran) == ("not supported", "torch 2.13.0 has no nccl2 (...): nothing ran",
                                                     [])
    monkeypatch.setattr(gpu_check, "nccl2_missing", lambda: "")
    run_step(dataclasses.replace(step, missing=gpu_check.nccl2_missing), 1, str(tmp_path), on_cpu=False)
    assert ran and ran[0][ran[0].index("--backend") + 1] == "nccl2"


def test_the_fault_tolerance_step_runs_on_cpu_on_any_torch(tmp_path, capsys):
    """Its dry run takes gloo, which every torch has: a reconfigure clause (skipping before 2.14, saying which torch
    adds it) and an all_reduce pass."""
    assert main(["--dry-run-on-cpu", "--only", "fault-tolerance", "--report-dir", str(tmp_path)]) == EXIT_PASSED
    assert "fault-tolerance: PASSED: " in capsys.readouterr().out


def test_world_size_one_skips_per_case_what_needs_a_peer(tmp_path):
    """One GPU gives NCCL world size 1: a parameter marked min_world_size(2) (send/recv among the entry
    points) skips saying so, while its clause's other cases run."""
    proc = warm.run(
        [sys.executable, "-m", "pytest", "suites/c10d/test_entry_points.py", "-k", "send_recv or isend_irecv or all_reduce",
         "--backend", "reference", "--world-size", "1", "-n", "0", "-q", "-p", "no:cacheprovider",
         "--report-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    cases = {case["nodeid"].split("[")[-1].rstrip("]"): case
             for case in json.loads((tmp_path / "conformance.json").read_text())["cases"]}
    # isend_irecv's ring of one is a send to the own rank (gloo refuses it, NCCL takes it only in a batch)
    for name in ("reference-ws1-send_recv", "reference-ws1-send_recv_object_list", "reference-ws1-isend_irecv"):
        assert (cases[name]["outcome"], cases[name]["reason"]) == ("skipped", "clause needs world size >= 2")
    assert cases["reference-ws1-all_reduce"]["outcome"] == "passed"
