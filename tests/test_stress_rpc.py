"""The RPC stress benchmark (suites/stress/rpc.py and its rpc_* modules): its records, regression check and
headline arithmetic, and the CLI end to end on TensorPipe with tiny call counts: one
run in a subprocess, as a user runs it, the others through main() in this process
(a fresh interpreter spends seconds importing torch on a loaded machine).

Benchmark figures are never asserted (this machine's timings are noise): only
the fields, the arithmetic, the exit status, and what happens to a hung agent,
a wrong answer, a regressed figure and bad options.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from reports.benchmarks import RPC_COLUMNS
from suites.stress import rpc as rpc_stress
from suites.stress.records import (Baseline, BaselineRecord, RecordError, RepeatFigures, RpcKey, RpcProfile,
                                   RpcRecord, read_stress)
from suites.stress.rpc_figures import best_of, make_record, with_ratios
from suites.stress.rpc_options import UsageError, load_baseline, parse_args, plan
from suites.stress.rpc_verdicts import TARGETS, check_regressions, headline
from tests.test_report_benchmarks import JSONISH
from tests.test_stress_collectives import check_refused_key, run_benchmark

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(REPO_ROOT, "suites", "stress", "baselines", "rpc.json")
CLI_TIMEOUT_S = 120
REQUIRED = ("agent", "backend", "world_size", "benchmark", "mode", "profiled", "calls", "rpcs_per_s", "p50_us",
            "p99_us", "seconds", "wrong")
TINY = ("--calls", "40", "--heavy-calls", "4", "--train-steps", "3", "--warmup", "3")


# ------------------------------------------------------------------ records
def _result(rank, seconds, samples_us=None, wrong=0):
    samples = None if samples_us is None else [int(us * 1000) for us in samples_us]
    return {"rank": rank, "seconds": seconds, "calls": 4, "warmup": 2, "samples_ns": samples, "wrong": wrong,
            "profile": None}


def _key(agent="tensorpipe", benchmark="light", mode="sync", profiled=False, backend="gloo") -> RpcKey:
    return RpcKey(agent, backend, 2, benchmark, mode, profiled)


def _record(key: RpcKey, calls: int = 1000, rpcs: float = 1000.0, p50: float | None = 100.0) -> RpcRecord:
    p50 = p50 if key.mode != "async" else None
    return RpcRecord(key=key, calls=calls, warmup=2, rpcs_per_s=rpcs, p50_us=p50,
                     p99_us=None if p50 is None else 2 * p50, seconds=calls / rpcs, per_rank_rpcs_per_s=(rpcs,),
                     per_rank_seconds=(calls / rpcs,), per_rank_p50_us=None, per_rank_p99_us=None, wrong=0)


def _baseline(records: list[RpcRecord]) -> Baseline:
    return Baseline("b.json", "", {}, tuple(BaselineRecord(r.key, r.calls, r.rpcs_per_s, r.p50_us) for r in records))


def test_record_takes_the_slowest_rank():
    """rpcs_per_s is calls over the slowest rank's time; p50/p99 the worst rank's percentiles."""
    results = [_result(0, 0.002, [10, 20, 30, 400], wrong=1), _result(1, 0.004, [50, 60, 70, 80])]
    r = make_record(_key(), 4, results)
    assert r.seconds == 0.004 and r.rpcs_per_s == pytest.approx(1000.0)
    assert list(r.per_rank_rpcs_per_s) == pytest.approx([2000.0, 1000.0])
    assert r.p50_us == pytest.approx(60.0)  # rank 1's p50 (nearest rank: 2nd of 4)
    assert r.p99_us == pytest.approx(400.0)  # rank 0's p99
    assert list(r.per_rank_p50_us) == pytest.approx([20.0, 60.0])
    assert r.wrong == 1
    burst = make_record(_key(mode="async"), 4, [_result(0, 0.001), _result(1, 0.002)])
    assert burst.p50_us is None and burst.p99_us is None and burst.rpcs_per_s == pytest.approx(2000.0)
    for field in REQUIRED:
        assert field in r.to_json() and field in burst.to_json()


def test_best_of_repeats_is_the_fastest_run_and_counts_every_wrong_answer():
    runs = [[_result(0, 0.004, [10, 20, 30, 40]), _result(1, 0.003, [10, 20, 30, 40], wrong=2)],
            [_result(0, 0.002, [90, 90, 90, 90]), _result(1, 0.001, [5, 5, 5, 5], wrong=1)]]
    r = best_of(_key(), 4, runs)
    assert r.seconds == 0.002 and r.p50_us == pytest.approx(90.0)  # the fastest run, all its figures
    assert [x.seconds for x in r.repeats] == [0.004, 0.002]
    assert r.wrong == 3


def _records(rpcs=1000.0, p50=100.0):
    return [_record(_key(), rpcs=rpcs, p50=p50), _record(_key(mode="async"), rpcs=rpcs)]


def test_equal_figures_do_not_regress():
    regressions, missing = check_regressions(_records(), _baseline(_records()), 0.0)
    assert regressions == [] and missing == []


@pytest.mark.parametrize("rpcs, p50, metrics", [
    (700.0, 100.0, {"rpcs_per_s"}),  # 30% fewer RPCs/s
    (1000.0, 130.0, {"p50_us"}),  # p50 30% higher
    (850.0, 100.0, set()),  # 15%: within 20%
    (1000.0, 119.0, set()),
])
def test_regression_is_more_than_max_percent_worse(rpcs, p50, metrics):
    regressions, _ = check_regressions(_records(rpcs, p50), _baseline(_records()), 20.0)
    assert {g["metric"] for g in regressions} == metrics
    for g in regressions:
        assert g["agent"] == "tensorpipe" and g["max_regression_pct"] == 20.0


def test_records_missing_from_the_baseline_are_listed_not_failed():
    baseline = _baseline(_records()[:1])
    other_calls = _records()
    other_calls[0] = dataclasses.replace(other_calls[0], calls=50)
    regressions, missing = check_regressions(other_calls, baseline, 20.0)
    assert regressions == []
    assert [m["why"] for m in missing] == ["baseline has 1000 calls, this run 50", "not in the baseline"]


def test_train_record_times_the_trainers_only():
    """train: steps/s and step times come from the trainers; the server's (untimed) result adds only its wrong count."""
    server = dict(_result(0, 0.0, wrong=1), timed=False)
    trainers = [dict(_result(r, seconds, [1000, 2000, 3000, 4000]), timed=True) for r, seconds in ((1, 0.5), (2, 0.4))]
    r = make_record(_key(benchmark="train", mode="step"), 4, [server] + trainers)
    assert r.seconds == 0.5 and r.rpcs_per_s == r.steps_per_s == pytest.approx(8.0)
    assert r.to_json()["steps_per_s"] == r.rpcs_per_s  # the JSON keeps the train benchmark's own name
    assert list(r.per_rank_rpcs_per_s) == pytest.approx([8.0, 10.0]) and r.p50_us == pytest.approx(2000.0)
    assert r.wrong == 1


def test_train_runs_once_in_its_own_mode():
    """--benchmarks train adds one (train, step) measurement whatever --modes says; it cannot be profiled."""
    args = parse_args(["--benchmarks", "light,train", "--modes", "sync", "--profile"])
    assert plan(args) == [("light", "sync", False), ("light", "sync", True), ("train", "step", False)]
    assert any(t.benchmark == "train" and t.agent == "reference-tp" and t.bound == 1.0 for t in TARGETS)


def test_headline_targets():
    """Relative targets use x_tensorpipe, absolute ones the figure; the worst world counts."""
    args = parse_args(["--agent", "tensorpipe,reference-tp,reference-pg"])
    records = []
    for agent, rpcs, p50 in (("tensorpipe", 1000.0, 200.0), ("reference-tp", 2000.0, 50.0),
                             ("reference-pg", 400.0, 300.0)):
        for mode in ("async", "sync"):
            records.append(_record(_key(agent, mode=mode), rpcs=rpcs, p50=p50))
    records = with_ratios(records)
    status = {h["target"]: (h["status"], h["value"]) for h in headline(records, args, [])}
    assert len(status) == len(TARGETS)
    assert status["reference-tp light async rpcs_per_s >= 1.5x tensorpipe"] == ("PASS", pytest.approx(2.0))
    assert status["reference-tp light sync p50_us <= 60 us"] == ("PASS", pytest.approx(50.0))
    assert status["reference-pg over gloo light sync rpcs_per_s >= 0.5x tensorpipe"] == ("MISS", pytest.approx(0.4))
    only_tp = headline([r for r in records if r.key.agent == "tensorpipe"], args,
                       [{"agent": "reference-tp", "reason": "not built"}])
    assert only_tp[0]["status"] == "NOT MEASURED" and "reference-tp unavailable: not built" in only_tp[0]["why"]


def test_stored_baseline_is_loadable_and_says_how_it_was_made():
    data = load_baseline(BASELINE)
    assert data.command.startswith("python -m suites.stress.rpc")
    assert data.host["cpus"] and "load_average" in data.host
    expected = {RpcKey(agent, "gloo", 4, benchmark, mode, profiled)
                for agent in ("tensorpipe", "reference-pg", "reference-tp")
                for benchmark, mode, profiled in plan(parse_args(["--profile"]))}
    assert {r.key for r in data.records} == expected  # the default run, with --profile, on every agent
    for r in read_stress(BASELINE):  # every record whole, as the typed reader reads a stress.json
        for field in REQUIRED:
            assert field in r.to_json()


# ------------------------------------------------------------------ CLI
def run_cli(tmp_path, *args: str, timeout: float = CLI_TIMEOUT_S):
    return run_benchmark("suites.stress.rpc", "stress.json", tmp_path / "report", *args, timeout=timeout)


def run_main(tmp_path, capsys, *args: str):
    """main() of the CLI in this process: (exit status, stdout, report). Its worlds fork from this
    session's zygote, so no interpreter has to import torch again (seconds each on a loaded machine)."""
    report_dir = tmp_path / "report"
    status = rpc_stress.main(["--report-dir", str(report_dir), *args])
    out = capsys.readouterr().out
    path = report_dir / "stress.json"
    return status, out, json.loads(path.read_text()) if path.exists() else None


def _why(proc) -> str:
    return proc.stdout[-4000:] + proc.stderr[-3000:]


def _easy_baseline() -> dict:
    """Every record of the profiled run below, 1000x slower than any machine: nothing can regress."""
    records = []
    for benchmark, mode, profiled in plan(parse_args(["--profile"])):
        key = _key(benchmark=benchmark, mode=mode, profiled=profiled).to_json()
        records.append(dict(key, calls={"light": 40, "heavy": 4, "train": 3}[benchmark], rpcs_per_s=0.01,
                            p50_us=1e9 if mode in ("sync", "step") else None))
    return {"records": records}


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """One CLI run on TensorPipe with --profile, --write-baseline and an easily met --baseline,
    shared by the tests below (every CLI run costs seconds of torch imports)."""
    tmp_path = tmp_path_factory.mktemp("rpc_stress")
    written = tmp_path / "written.json"
    easy = tmp_path / "easy.json"
    easy.write_text(json.dumps(_easy_baseline()))
    proc, report = run_cli(tmp_path, "--agent", "tensorpipe", "--world-size", "2", "--profile", *TINY,
                           "--baseline", str(easy), "--max-regression", "0", "--write-baseline", str(written))
    return proc, report, written


def test_cli_writes_every_record_with_the_required_fields(profiled_run):
    """stress.json has one record per (agent, backend, benchmark, mode, profiled) with the issue's fields."""
    proc, report, _ = profiled_run
    assert proc.returncode == 0, _why(proc)
    records = report["records"]
    got = {(r["benchmark"], r["mode"], r["profiled"]) for r in records}
    assert got == {("light", "async", False), ("light", "sync", False), ("light", "async", True),
                   ("light", "sync", True), ("heavy", "async", False), ("heavy", "sync", False),
                   ("train", "step", False)}
    for r in records:
        for field in REQUIRED:
            assert field in r, field
        assert (r["agent"], r["backend"], r["world_size"], r["wrong"]) == ("tensorpipe", "gloo", 2, 0)
        assert r["calls"] == {"light": 40, "heavy": 4, "train": 3}[r["benchmark"]]
        assert r["rpcs_per_s"] == pytest.approx(r["calls"] / r["seconds"])
        assert r["x_tensorpipe"] == pytest.approx(1.0)
        if r["mode"] in ("sync", "step"):
            assert 0 < r["p50_us"] <= r["p99_us"]
        else:
            assert r["p50_us"] is None
    assert report["errors"] == [] and report["exit_status"] == 0
    assert [h["status"] for h in report["headline"]] == ["NOT MEASURED"] * len(TARGETS)
    assert "needs --agent tensorpipe,reference-tp" in proc.stdout  # says why, invents nothing
    assert "# light RPC, async" in proc.stdout and "x_tensorpipe" in proc.stdout
    assert "# distributed training (3 steps per trainer" in proc.stdout


def test_cli_profile_reports_overhead_next_to_the_unprofiled_run(profiled_run):
    """--profile: each light record has a profiled twin with overhead = profiled / unprofiled seconds."""
    proc, report, _ = profiled_run
    assert proc.returncode == 0, _why(proc)
    by_key = {(r["mode"], r["profiled"]): r for r in report["records"] if r["benchmark"] == "light"}
    for mode in ("async", "sync"):
        profiled, plain = by_key[(mode, True)], by_key[(mode, False)]
        assert profiled["overhead"] == pytest.approx(profiled["seconds"] / plain["seconds"])
        assert profiled["profile"]["events"] > 0  # the profiler really was on
    assert by_key[("sync", True)]["profile"]["rpc_records"] == 2 * 40  # one record per timed call per rank
    assert "profiler_legacy" in proc.stdout and "overhead" in proc.stdout


def test_cli_passes_a_baseline_it_meets_and_writes_one_equal_to_its_report(profiled_run):
    """A baseline the run beats passes (exit 0); --write-baseline stores the run's records, command and host."""
    proc, report, written = profiled_run
    assert proc.returncode == 0, _why(proc)
    assert report["regressions"] == [] and report["not_in_baseline"] == []
    assert "no regressions" in proc.stdout
    data = load_baseline(str(written))
    assert data.command.startswith("python -m suites.stress.rpc --report-dir")
    assert data.host["cpus"] and json.loads(written.read_text())["records"] == report["records"]
    records = read_stress(str(written))
    assert [r.to_json() for r in records] == report["records"]  # the typed records write the file's keys back
    assert check_regressions(records, data, 0.0) == ([], [])  # an equal baseline passes


def test_cli_fails_on_a_regressed_figure(profiled_run, tmp_path, capsys):
    """Against a baseline 100x better (RPCs/s and p50) the run lists every regression and exits 1."""
    _, _, written = profiled_run
    fast = json.loads(written.read_text())
    for r in fast["records"]:
        r["rpcs_per_s"] *= 100
        r["p50_us"] = r["p50_us"] / 100 if r["p50_us"] else r["p50_us"]
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    status, out, report = run_main(tmp_path, capsys, "--agent", "tensorpipe", "--world-size", "2",
                                   "--benchmarks", "light", *TINY, "--baseline", str(tmp_path / "fast.json"),
                                   "--max-regression", "50")
    assert status == 1, out
    assert {(g["mode"], g["metric"]) for g in report["regressions"]} == {
        ("async", "rpcs_per_s"), ("sync", "rpcs_per_s"), ("sync", "p50_us")}
    assert "REGRESSED tensorpipe gloo ws2 light sync: rpcs_per_s" in out
    assert report["errors"] == [] and report["exit_status"] == 1


def test_cli_hung_agent_is_an_error_row_and_the_run_goes_on(tmp_path, capsys):
    """An agent whose calls never return: a DeadlineExceeded error row with the callee's stack, then a
    fresh world and agent measure the next benchmark, and the run exits 1."""
    status, out, report = run_main(tmp_path, capsys, "--agent", "tensorpipe", "--world-size", "2", "--modes", "sync",
                                   "--benchmarks", "light,heavy", *TINY, "--plant", "tensorpipe:stall",
                                   "--deadline", "6")
    assert status == 1, out
    [error] = report["errors"]
    assert (error["agent"], error["benchmark"], error["mode"], error["stage"]) == ("tensorpipe", "light", "sync",
                                                                                  "measure")
    assert error["error"].startswith("DeadlineExceeded")
    assert "rpc_udfs.py" in error["detail"] and "in stall" in error["detail"]  # the callee's stack
    # a fresh world and agent measured the next benchmark
    assert [(r["benchmark"], r["mode"]) for r in report["records"]] == [("heavy", "sync")]
    assert "ERROR (measure): DeadlineExceeded" in out


def test_cli_counts_wrong_answers(tmp_path, capsys):
    """Every answer other than 0 counts, over warm-ups and repeats; any makes the exit status 1."""
    status, out, report = run_main(tmp_path, capsys, "--agent", "tensorpipe", "--world-size", "2",
                                   "--benchmarks", "light", "--modes", "async", *TINY, "--plant", "tensorpipe:wrong",
                                   "--repeat", "2")
    assert status == 1, out
    [record] = report["records"]
    assert len(record["repeats"]) == 2
    assert record["wrong"] == 2 * 2 * (40 + 3) and report["wrong_total"] == record["wrong"]
    assert "WRONG: tensorpipe gloo ws2 light async" in out


@pytest.mark.parametrize("args, message", [
    (("--agent", "tensorpipe,grpc"), "--agent: unknown 'grpc'; known: tensorpipe, tensorpipe-shm, reference-pg, reference-tp"),
    (("--modes", "burst"), "--modes: unknown 'burst'; known: async, sync"),
    (("--world-size", "1"), "--world-size: need world sizes >= 2"),
    (("--num-worker-threads", "0"), "--num-worker-threads must be >= 1"),
    (("--profile-benchmarks", "medium"), "--profile-benchmarks: unknown 'medium'; known: light, heavy"),
    (("--plant", "tensorpipe:crash"), "--plant: 'tensorpipe:crash' is not AGENT:FAULT"),
    (("--baseline", "/nonexistent/rpc.json"), "--baseline: cannot read /nonexistent/rpc.json"),
])
def test_usage_errors_exit_2_with_a_clear_message(tmp_path, args, message):
    """Bad options are refused before any process starts, with a message naming the option."""
    proc, report = run_cli(tmp_path, *args, timeout=60)
    assert proc.returncode == 2, _why(proc)
    assert message in proc.stderr
    assert report is None


def test_unknown_backend_and_bad_baseline_are_usage_errors(tmp_path, capsys):
    """An unknown backend and a baseline without the record fields are usage errors too (exit 2)."""
    assert rpc_stress.main(["--backend", "no_such_backend", "--report-dir", str(tmp_path / "report")]) == 2
    assert "usage error: unknown backend 'no_such_backend'" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"records": [{"agent": "tensorpipe"}]}))
    proc, _ = run_cli(tmp_path, "--baseline", str(bad), timeout=60)
    assert proc.returncode == 2 and "a record lacks backend" in proc.stderr
    bad.write_text(json.dumps({"records": [dict(_key().to_json(), calls="many", rpcs_per_s=1.0, p50_us=None)]}))
    with pytest.raises(UsageError, match="'calls' is \"many\", expected an integer"):
        load_baseline(str(bad))


# ------------------------------------------------------------------ the records' JSON
NUMBER = st.floats(allow_nan=False, min_value=0, max_value=1e9) | st.integers(0, 10 ** 6)
KEYS = st.builds(RpcKey, st.sampled_from(["tensorpipe", "reference-tp"]), st.just("gloo"), st.integers(2, 8),
                 st.sampled_from(["light", "heavy", "train"]), st.sampled_from(["async", "sync", "step"]), st.booleans())
FIGURES = st.builds(RepeatFigures, NUMBER | st.none(), NUMBER | st.none(), NUMBER | st.none(), NUMBER)


@st.composite
def rpc_records(draw):
    key = draw(KEYS)
    ranks = draw(st.integers(1, 3))
    per_rank = st.tuples(*[NUMBER] * ranks)
    return RpcRecord(
        key=key, calls=draw(st.integers(1, 10 ** 4)), warmup=draw(st.integers(0, 50)), rpcs_per_s=draw(NUMBER | st.none()),
        p50_us=draw(NUMBER | st.none()), p99_us=draw(NUMBER | st.none()), seconds=draw(NUMBER),
        per_rank_rpcs_per_s=draw(st.tuples(*[NUMBER | st.none()] * ranks)), per_rank_seconds=draw(per_rank),
        per_rank_p50_us=draw(per_rank | st.none()), per_rank_p99_us=draw(per_rank | st.none()),
        wrong=draw(st.integers(0, 100)),
        profile=draw(st.builds(RpcProfile, st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), NUMBER))
        if key.profiled else None,
        repeats=tuple(draw(st.lists(FIGURES, max_size=2))), wall_s=draw(NUMBER | st.none()),
        x_tensorpipe=draw(NUMBER | st.none()), overhead=draw(NUMBER | st.none()) if key.profiled else None)


@settings(max_examples=60, deadline=None)
@given(record=rpc_records())
def test_rpc_records_round_trip_through_the_files_json(record):
    """to_json writes the keys stress.json has always had (REQUIRED and the conditional ones); from_json reads
    them back to the same record, through a real JSON text."""
    data = json.loads(json.dumps(record.to_json()))
    assert RpcRecord.from_json(data) == record
    assert ("steps_per_s" in data) == (record.key.benchmark == "train")
    assert ("profile" in data) == ("overhead" in data) == record.key.profiled
    assert all(field in data for field in REQUIRED + ("repeats", "wall_s", "x_tensorpipe"))
    assert {key for _, key in RPC_COLUMNS} <= set(data)  # reports/benchmarks.py's CSV reads these keys


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.one_of(st.binary(max_size=40), st.builds(lambda d: json.dumps(d).encode(), JSONISH),
                          st.builds(lambda rs: json.dumps({"records": rs}).encode(),
                                    st.lists(st.dictionaries(st.sampled_from(REQUIRED + ("repeats", "profile")),
                                                             JSONISH, max_size=14), max_size=2))),
       mutate=st.sampled_from([None, "drop", "retype"]), record=rpc_records(), which=st.integers(0, 30))
def test_reading_a_file_that_is_not_a_stress_json_is_a_record_error(tmp_path, document, mutate, record, which):
    """Any bytes: the readers return records or raise RecordError naming the file; a real record with one key
    dropped or given a wrong type names that key."""
    path = tmp_path / "stress.json"
    path.write_bytes(document)
    for read in (read_stress, load_baseline):
        try:
            read(str(path))
        except (RecordError, UsageError) as exc:  # load_baseline: the same message after "--baseline: "
            assert str(path) in str(exc)
    if mutate:
        data = record.to_json()
        check_refused_key(path, read_stress, data, list(data)[which % len(data)], mutate)

