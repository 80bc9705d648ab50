"""The command line, end to end: each case runs ``python -m pytest ...`` from the repo root."""

import re

import pytest

from tests.harness_cases.procs import finish_pytest, run_pytest, start_pytest, wait_until_gone


ALL_REDUCE = "suites/c10d/test_all_reduce.py"
HANG_CRASH = "tests/harness_cases/case_hang_crash.py"
WAITING = "suites/c10d/test_timeouts.py"  # every clause marked `waits`
pytestmark = pytest.mark.timeout(300)


def counts(output: str) -> dict:
    """The outcome counts of pytest's final summary line."""
    last = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|xfailed|deselected)", line)]
    assert last, f"no pytest summary line in:\n{output}"
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last[-1])}


def assert_no_traceback(run):
    assert "Traceback" not in run.output, run.output
    assert "INTERNALERROR" not in run.output, run.output


# ------------------------------------------------- cheap runs, started together
@pytest.fixture(scope="module")
def cheap_runs(tmp_path_factory):
    """Runs that start no world: launched concurrently to save wall time."""
    base = tmp_path_factory.mktemp("cli")
    specs = {
        "nosuch": [ALL_REDUCE, "--backend", "nosuch"],
        "ws0": [ALL_REDUCE, "--world-size", "0"],
        "wsx": [ALL_REDUCE, "--world-size", "x"],
        "nccl": [ALL_REDUCE, "--backend", "nccl", "--world-size", "2", "-rs", "--allow-unavailable"],
        "nccl_refused": [ALL_REDUCE, "--backend", "gloo,nccl", "--world-size", "2"],
        "collect": [ALL_REDUCE, "--collect-only", "-q"],
        "collect_k": [ALL_REDUCE, "--collect-only", "-q", "-k", "gloo-ws3 and float32-sum"],
        "waits_default": [WAITING, "--collect-only", "-q"],
        "waits_named": [WAITING, "--collect-only", "-q", "--world-size", "2,3"],
    }
    handles = {name: start_pytest(args, base / name) for name, args in specs.items()}
    return {name: finish_pytest(handle) for name, handle in handles.items()}


def test_a_waiting_clause_runs_at_one_size_unless_the_sizes_are_named(cheap_runs):
    """Without --world-size a clause marked `waits` keeps its smallest allowed size; --world-size 2,3 runs both."""
    default, named = cheap_runs["waits_default"], cheap_runs["waits_named"]
    assert default.returncode == 0 and named.returncode == 0, default.output + named.output
    assert "-ws2" in default.output and "-ws3" not in default.output, default.output
    assert "-ws2" in named.output and "-ws3" in named.output, named.output


def test_the_summary_says_what_a_default_form_left_out():
    from reports.markdown import render

    text = render([], {"left_out": ["clauses marked `waits` ran at one world size"]})
    assert "Left out by default: clauses marked `waits` ran at one world size." in text


def test_unknown_backend_is_a_one_line_usage_error(cheap_runs):
    run = cheap_runs["nosuch"]
    assert run.returncode == 4, run.output  # pytest.ExitCode.USAGE_ERROR
    lines = [line for line in run.output.splitlines() if line.strip()]
    assert len(lines) == 1, run.output
    line = lines[0]
    assert "'nosuch'" in line and "unknown backend" in line
    known = line.split("known backends:", 1)[1]
    for name in ("gloo", "nccl", "mpi", "ucc"):
        assert re.search(rf"\b{name}\b", known), line
    assert_no_traceback(run)


@pytest.mark.parametrize("name, shown", [("ws0", "0"), ("wsx", "'x'")])
def test_bad_world_size_is_a_usage_error(cheap_runs, name, shown):
    run = cheap_runs[name]
    assert run.returncode == 4, run.output
    lines = [line for line in run.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--world-size" in lines[0] and shown in lines[0], run.output
    assert_no_traceback(run)


def test_unavailable_backend_fails_the_run_with_the_reason(cheap_runs):
    """A lane that lost its GPUs must not look green: the backend a run names must be usable."""
    if _nccl_available():
        pytest.skip("nccl is available on this machine")
    run = cheap_runs["nccl_refused"]
    assert run.returncode == 4, run.output  # pytest.ExitCode.USAGE_ERROR
    lines = [line for line in run.output.splitlines() if line.strip()]
    assert len(lines) == 1, run.output
    assert "nccl unavailable" in lines[0] and "--allow-unavailable" in lines[0], run.output
    assert "gloo" not in lines[0].split("--backend:", 1)[1].split("(pass", 1)[0], run.output  # names nccl only
    assert_no_traceback(run)


def _nccl_available() -> bool:
    from backends.registry import BackendRegistry

    return BackendRegistry().get("nccl").availability().available


def test_unavailable_backend_skips_every_case_with_the_reason_when_allowed(cheap_runs):
    """--allow-unavailable: today's exploratory behaviour, and summary.md's first line says nothing ran."""
    if _nccl_available():
        pytest.skip("nccl is available on this machine")
    run = cheap_runs["nccl"]
    # all collected cases skipped is a successful run for pytest (5 would be "no tests collected")
    assert run.returncode == 0, run.output
    summary = counts(run.output)
    assert set(summary) == {"skipped"} and summary["skipped"] > 0, run.output
    assert "unavailable" in run.output and "nccl" in run.output

    report = run.report()
    assert report["meta"]["exit_status"] == 0
    assert report["totals"] == {"skipped": summary["skipped"]}
    reasons = set()
    for case in report["cases"]:
        assert case["outcome"] == "skipped" and case["backend"] == "nccl" and case["world_size"] == 2, case
        assert "nccl" in case["reason"] and "unavailable" in case["reason"], case
        assert "-ws2-" in case["nodeid"] and case["nodeid"].split("[")[1].startswith("nccl-ws2")
        reasons.add(case["reason"])
    assert len(reasons) == 1
    markdown = run.read("summary.md")
    assert markdown.splitlines()[0].startswith("# distconform summary: NOTHING RAN (every case skipped"), markdown
    assert f"| nccl | c10d | 0 | 0 | 0 | 0 | 0 | {summary['skipped']} |" in markdown
    assert "## Skipped" in markdown and reasons.pop() in markdown


def test_ids_name_backend_and_world_size_and_k_selects_one_case(cheap_runs):
    run = cheap_runs["collect"]
    assert run.returncode == 0, run.output
    ids = [line for line in run.output.splitlines() if "::" in line]
    assert f"{ALL_REDUCE}::test_all_reduce[gloo-ws2-float32-sum]" in ids
    assert f"{ALL_REDUCE}::test_all_reduce[gloo-ws3-float32-sum]" in ids
    assert all("[gloo-ws2-" in i or "[gloo-ws3-" in i for i in ids)
    assert sum("[gloo-ws2-" in i for i in ids) == sum("[gloo-ws3-" in i for i in ids)
    assert "summary.md" not in run.output  # --collect-only writes no report, so names none

    run = cheap_runs["collect_k"]
    assert run.returncode == 0, run.output
    selected = [line for line in run.output.splitlines() if "::test_all_reduce[" in line]
    assert selected == [f"{ALL_REDUCE}::test_all_reduce[gloo-ws3-float32-sum]"], run.output
    assert all("gloo-ws3" in line for line in run.output.splitlines() if "::" in line)


# ------------------------------------------------------------- plugin backend
def test_plugin_backend_without_spec_is_held_to_the_full_contract(tmp_path):
    run = run_pytest([ALL_REDUCE, "--world-size", "2", "-q",
                      "--backend-plugin", "tests.harness_cases.plugin_backend", "--backend", "plugin_gloo",
                      "-k", "non_contiguous or float32-sum"], tmp_path)
    # gloo's non-contiguous gap is declared for "gloo" only: for a spec-less plugin it is a failure
    assert run.returncode == 1, run.output
    cases = run.cases()
    assert cases, run.output
    failed = {n for n, c in cases.items() if c["outcome"] == "failed"}
    assert failed == {n for n in cases if "non_contiguous" in n}, run.output
    assert len(failed) >= 2
    assert all(c["outcome"] == "passed" for n, c in cases.items() if n not in failed)
    assert all(c["backend"] == "plugin_gloo" and "[plugin_gloo-ws2-" in n for n, c in cases.items())
    for name in failed:
        assert "strided view" in cases[name]["error"] and cases[name]["reason"] == ""
    assert run.report()["meta"]["plugins"] == ["tests.harness_cases.plugin_backend"]
    assert "xfail" not in counts(run.output)


# -------------------------------------------------------------------- xdist
def test_xdist_run_passes_and_writes_one_report(tmp_path):
    run = run_pytest([ALL_REDUCE, "-n", "2", "--world-size", "2", "-q", "-k", "float32"], tmp_path, watch=True)
    assert run.returncode == 0, run.output
    for collision in ("Address already in use", "EADDRINUSE", "address in use"):
        assert collision not in run.output
    summary = counts(run.output)
    assert summary.get("failed", 0) == 0 and summary["passed"] > 0
    report = run.report()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conformance.json", "junit.xml", "report.html", "summary.md"]
    ran = sum(summary.get(k, 0) for k in ("passed", "xfailed", "skipped"))
    assert len(report["cases"]) == ran, "the controller's report must hold every worker's cases"
    assert report["totals"] == {k: summary[k] for k in ("passed", "xfailed") if k in summary}
    assert all(c["area"] == "c10d" and c["clause"] and c["backend"] == "gloo" for c in report["cases"])
    # both workers ran worlds of their own (distinct session tags) and nothing outlived the run
    sessions = set(run.seen.values())
    assert len(sessions) == 2, sessions
    assert not wait_until_gone(tuple(sessions)), "processes outlived the xdist run"
    assert not run.survivors(), run.survivors()


# ------------------------------------------- injected hang and crash under pytest
def test_injected_hang_and_crash_fail_with_diagnostics_and_leave_nothing_behind(tmp_path):
    # the module does not match test_*.py: pytest still collects a file named on the command line
    run = run_pytest([HANG_CRASH, "--world-size", "2", "-q"], tmp_path, watch=True)
    assert run.returncode == 1, run.output
    node = f"{HANG_CRASH}::{{}}[gloo-ws2]"
    cases = run.cases()
    outcomes = {name: c["outcome"] for name, c in cases.items()}
    assert outcomes == {
        node.format("test_injected_hang"): "failed",
        node.format("test_after_hang"): "passed",
        node.format("test_injected_crash"): "failed",
        node.format("test_after_crash"): "passed",
    }, run.output
    assert counts(run.output) == {"failed": 2, "passed": 2}

    # the hang: the 3 s deadline fired, with every rank's Python stack
    assert "did not finish within its 3 s deadline" in run.output
    assert "Python stacks of every rank at expiry" in run.output
    assert "in hang_rank0_sleeps" in run.output and "in barrier" in run.output
    hang = cases[node.format("test_injected_hang")]
    assert "DeadlineExceeded" in hang["error"]
    assert hang["duration"] < 20

    # the crash: the dead rank and its exit status
    assert "rank 1 of world gloo-ws2 died (exit status 7)" in run.output
    assert "RankDied" in cases[node.format("test_injected_crash")]["error"]

    # no process of the session outlives it: the watcher saw this run's processes, all gone now
    prefix = run.session_tag_prefix
    assert run.seen and all(tag.startswith(prefix) for tag in run.seen.values()), run.seen
    assert not wait_until_gone(prefix, timeout=2.0)
    assert not run.survivors(), run.survivors()
