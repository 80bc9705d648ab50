"""The collective benchmark (suites/stress/collectives.py): its arithmetic, its oracle
shortcut, and the CLI end to end (tiny sizes, in a subprocess, as a user runs it).

Benchmark figures are never asserted here (this machine's timings are noise);
only the columns, the nccl-tests definitions, correctness counting, exit
status and the handling of hangs and unavailable backends.
"""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from backends.reference import semantics
from suites.stress import metrics
from suites.stress.collectives import COLUMNS, HEADLINE_TARGETS
from suites.stress.rank_bench import expected_output, fill_modulus, rank_input
from suites.stress.records import CollectiveRow, RecordError, read_collectives
from reports.benchmarks import COLLECTIVE_COLUMNS
from tests.test_report_benchmarks import JSONISH
from tests.harness_cases import warm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_TIMEOUT_S = 180
MIB = 1 << 20


# ------------------------------------------------------------------ metrics
@pytest.mark.parametrize("collective, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 3, 4 / 3), ("all_reduce", 1, 0.0),
    ("all_gather", 2, 0.5), ("all_gather", 4, 0.75), ("reduce_scatter", 4, 0.75), ("reduce_scatter", 3, 2 / 3),
    ("all_to_all", 4, 0.75), ("all_to_all", 8, 7 / 8), ("broadcast", 4, 1.0), ("reduce", 8, 1.0),
])
def test_bus_factor_is_nccl_tests(collective, n, factor):
    assert metrics.bus_factor(metrics.entry(collective), n) == pytest.approx(factor)


def test_unknown_benchmark_name_is_rejected():
    with pytest.raises(ValueError, match="unknown collective"):
        metrics.entry("all_sum")


def test_bandwidths():
    assert metrics.algbw(2_000_000_000, 1.0) == pytest.approx(2.0)  # GB = 1e9 bytes
    assert metrics.busbw(metrics.entry("all_reduce"), 4, 1_000_000_000, 0.5) == pytest.approx(2.0 * 1.5)
    assert metrics.busbw(metrics.entry("all_gather"), 2, 1_000_000_000, 1.0) == pytest.approx(0.5)
    assert metrics.busbw(metrics.entry("broadcast"), 4, 1_000_000_000, 1.0) == pytest.approx(1.0)


def test_sizes_follow_nccl_tests_definitions():
    # all_reduce, broadcast: the buffer
    lay = metrics.layout(metrics.entry("all_reduce"), 1024, 4, 4)
    assert (lay.size, lay.count, lay.in_numel, lay.out_numel) == (1024, 256, 256, 256)
    lay = metrics.layout(metrics.entry("broadcast"), 1024, 4, 4)
    assert (lay.size, lay.count, lay.in_numel, lay.out_numel) == (1024, 256, 256, 256)
    # all_gather: size is the gathered output, n x per-rank count
    lay = metrics.layout(metrics.entry("all_gather"), 1024, 4, 4)
    assert (lay.size, lay.count, lay.chunk, lay.in_numel, lay.out_numel) == (1024, 256, 64, 64, 256)
    # reduce_scatter: size is the input, n x per-rank output count
    lay = metrics.layout(metrics.entry("reduce_scatter"), 1024, 4, 4)
    assert (lay.size, lay.count, lay.chunk, lay.in_numel, lay.out_numel) == (1024, 256, 64, 256, 64)
    # all_to_all: size is what each rank sends in total, n x per-peer count
    lay = metrics.layout(metrics.entry("all_to_all"), 1024, 4, 4)
    assert (lay.size, lay.count, lay.chunk, lay.in_numel, lay.out_numel) == (1024, 256, 64, 256, 256)


def test_partitioned_sizes_round_down_to_the_world_size():
    lay = metrics.layout(metrics.entry("all_gather"), 1024, 3, 4)  # 256 elements -> 85 per rank
    assert (lay.chunk, lay.size) == (85, 1020)
    lay = metrics.layout(metrics.entry("reduce_scatter"), 8, 4, 4)  # 2 elements, 4 ranks: one element each
    assert (lay.chunk, lay.size, lay.in_numel) == (1, 16, 4)
    assert metrics.layout(metrics.entry("all_reduce"), 2, 2, 4).count == 1  # at least one element


def test_percentile_is_nearest_rank():
    samples = [5, 1, 4, 2, 3]
    assert metrics.percentile(samples, 50) == 3
    assert metrics.percentile(samples, 99) == 5
    assert metrics.percentile(list(range(1, 101)), 99) == 99
    assert metrics.percentile([7], 50) == 7


def test_size_sweep():
    assert metrics.size_sweep(8, 4096, 4) == [8, 32, 128, 512, 2048, 4096]
    assert metrics.size_sweep(8, 64, 2) == [8, 16, 32, 64]
    default = metrics.size_sweep(8, 64 * MIB, 4, extra=[t[2] for t in HEADLINE_TARGETS])
    assert default[0] == 8 and default[-1] == 64 * MIB and 16 * MIB in default
    assert metrics.size_sweep(8, 4096, 4, extra=[16 * MIB]) == [8, 32, 128, 512, 2048, 4096]
    assert metrics.parse_bytes("64M") == 64 * MIB and metrics.parse_bytes("4K") == 4096
    assert metrics.parse_bytes("8") == 8
    with pytest.raises(ValueError):
        metrics.parse_bytes("lots")


# ------------------------------------------------------------------ oracle shortcut
# written out here, independently of the table (every table entry: tests/test_collectives_table.py)
@pytest.mark.parametrize("collective", ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
                                        "reduce"))
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_periodic_expectation_equals_the_full_oracle(collective, n):
    """The benchmark applies the oracle to one period of each chunk and tiles it;
    that must equal the oracle over the full inputs, element for element."""
    for nbytes in (8, 1000, 4096, 300_004):
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            modulus = fill_modulus(dtype, n)
            lay = metrics.layout(metrics.entry(collective), nbytes, n, dtype.itemsize)
            inputs = [rank_input(r, lay.in_numel, dtype, modulus) for r in range(n)]
            for rank in range(n):
                if collective == "all_reduce":
                    full = semantics.all_reduce(inputs, "sum")[rank]
                elif collective == "broadcast":
                    full = semantics.broadcast(inputs, 0)[rank]
                elif collective == "reduce":
                    full = semantics.reduce(inputs, "sum", 0) if rank == 0 else None
                elif collective == "all_gather":
                    full = torch.cat(semantics.all_gather(inputs)[rank])
                elif collective == "reduce_scatter":
                    full = semantics.reduce_scatter([list(t.chunk(n)) for t in inputs], "sum")[rank]
                else:
                    full = semantics.all_to_all_single(inputs, [None] * n)[rank]
                got = expected_output(metrics.entry(collective), rank, n, lay, dtype, modulus)
                if full is None:
                    assert got is None
                else:
                    assert torch.equal(got, full), (collective, n, nbytes, dtype, rank)


def test_fill_sums_stay_exact():
    for dtype, limit in ((torch.float32, 2 ** 24), (torch.bfloat16, 2 ** 8), (torch.float16, 2 ** 11)):
        for n in (2, 4, 8):
            assert n * fill_modulus(dtype, n) <= limit
    # neighbouring ranks' inputs differ, so a rotated all_gather is caught
    assert not torch.equal(rank_input(0, 100, torch.float32, 251), rank_input(1, 100, torch.float32, 251))


# ------------------------------------------------------------------ CLI
def run_benchmark(module: str, report_name: str, report_dir, *args: str, timeout: float = CLI_TIMEOUT_S):
    """Run ``python -m module --report-dir report_dir args`` as a user would: (process, report JSON or None).
    Also used by tests/test_stress_rpc.py."""
    cmd = [sys.executable, "-m", module, "--report-dir", str(report_dir), *args]
    env = {k: v for k, v in os.environ.items() if k != "DISTCONFORM_SESSION"}
    proc = warm.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    path = report_dir / report_name
    report = json.loads(path.read_text()) if path.exists() else None
    return proc, report


def run_cli(tmp_path, *args: str, timeout: float = CLI_TIMEOUT_S):
    return run_benchmark("suites.stress.collectives", "collectives.json", tmp_path / "report", *args, timeout=timeout)


def _nccl_unavailable() -> bool:
    from backends.registry import BackendRegistry

    return not BackendRegistry().get("nccl").availability().available


def test_cli_smoke_gloo(tmp_path):
    backends = "gloo,nccl" if _nccl_unavailable() else "gloo"
    proc, report = run_cli(tmp_path, "--backend", backends, "--world-size", "2", "--max-bytes", "4K",
                           "--iters", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = report["records"]
    rows = read_collectives(str(tmp_path / "report" / "collectives.json"))
    assert [r.to_json() for r in rows] == records  # the typed rows write the file's keys and values back
    collectives = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}
    assert {r["collective"] for r in records} == collectives
    assert len(records) == 5 * 6  # 8, 32, 128, 512, 2K, 4K
    for r in records:
        for key, _, _ in COLUMNS:
            assert key in r, key
        for key in ("backend", "world_size", "collective", "p50_us", "p99_us"):
            assert key in r, key
        assert r["backend"] == "gloo" and r["world_size"] == 2
        assert r["#wrong"] == 0
        assert r["time_us"] == r["p50_us"] <= r["p99_us"]
        assert r["iters"] == 3
        seconds = r["time_us"] / 1e6
        assert r["algbw"] == pytest.approx(r["size"] / 1e9 / seconds)
        assert r["busbw"] == pytest.approx(r["algbw"] * metrics.bus_factor(metrics.entry(r["collective"]), 2))
        assert r["count"] * 4 == r["size"] and r["type"] == "float32"
        assert r["redop"] == ("sum" if r["collective"] in ("all_reduce", "reduce_scatter") else "none")
        assert r["root"] == (0 if r["collective"] == "broadcast" else -1)
    assert report["wrong_total"] == 0 and report["errors"] == [] and report["exit_status"] == 0
    # the table went to stdout, one header per (backend, world size, collective)
    for collective in collectives:
        assert f"# gloo  world_size=2  {collective}" in proc.stdout
    assert "time_us" in proc.stdout and "#wrong" in proc.stdout
    # the headline says why it was not measured instead of inventing numbers
    assert "needs --backend gloo,reference" in proc.stdout
    assert {h["status"] for h in report["headline"]} == {"NOT MEASURED"}
    if "nccl" in backends:
        assert [u["backend"] for u in report["unavailable"]] == ["nccl"]
        assert "nccl: unavailable, skipped" in proc.stdout
    # CSV and plots beside collectives.json (reports/benchmarks.py), from this same run: one benchmark
    # process fewer than a run of their own (tests/test_report_benchmarks.py checks their content)
    assert "also written: collectives.csv, collectives_busbw.png" in proc.stdout
    with open(tmp_path / "report" / "collectives.csv", newline="") as fh:
        cells = list(csv.DictReader(fh))
    assert len(cells) == len(records) and {r["collective"] for r in cells} == collectives
    assert all(r["wrong"] == "0" for r in cells)
    assert (tmp_path / "report" / "collectives_time.svg").exists()


@pytest.mark.parametrize("bug, collective, size", [
    ("lost_chunk", "all_reduce", "1M"),  # only tensors over 64 Ki elements are chunked
    ("reduce_scatter_wrong_chunk", "reduce_scatter", "4K"),
])
def test_seeded_bug_shows_in_wrong_column(tmp_path, bug, collective, size):
    proc, report = run_cli(tmp_path, "--backend-plugin", f"tests.seeded.{bug}", "--backend", bug,
                           "--collectives", collective, "--world-size", "2", "--min-bytes", size,
                           "--max-bytes", size, "--iters", "3")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["wrong_total"] > 0
    assert [r["#wrong"] > 0 for r in report["records"]] == [True]
    assert f"WRONG: {bug} world_size=2 {collective}" in proc.stdout


def test_hang_becomes_an_error_and_the_run_goes_on(tmp_path):
    proc, report = run_cli(tmp_path, "--backend-plugin", "tests.harness_cases.bench_hang", "--backend", "bench_hang",
                           "--collectives", "all_reduce,broadcast", "--world-size", "2", "--max-bytes", "4K",
                           "--iters", "3", "--deadline", "3", timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    [error] = report["errors"]
    assert error["collective"] == "all_reduce" and error["error"].startswith("DeadlineExceeded")
    assert "bench_hang.py" in error["detail"]  # the hung rank's stack
    sizes = [r["size"] for r in report["records"] if r["collective"] == "all_reduce"]
    assert sizes and max(sizes) < 1024  # the rows before the hang were kept
    # a fresh world ran the next collective
    assert len([r for r in report["records"] if r["collective"] == "broadcast"]) == 6
    assert "ERROR bench_hang world_size=2 all_reduce" in proc.stdout


def test_unknown_backend_is_a_usage_error(tmp_path):
    proc, report = run_cli(tmp_path, "--backend", "no_such_backend", timeout=60)
    assert proc.returncode == 2
    assert "unknown backend 'no_such_backend'" in proc.stderr and "gloo" in proc.stderr
    assert report is None


def test_the_next_rows_time_is_extrapolated_only_within_a_bounded_step():
    """Linear in the size for a step of up to MAX_EXTRAPOLATION; a huge step from a latency-bound row is measured,
    not estimated (8 B at 36 us -> 64 MiB would be 'about 302 s', skipping a size an H200 does in microseconds)."""
    from suites.stress.collectives import MAX_EXTRAPOLATION, extrapolated_seconds

    assert extrapolated_seconds((1 << 20, 0.01), 1 << 21) == 0.02
    assert extrapolated_seconds((1 << 20, 0.01), 1 << 19) == 0.01  # never less than the last row
    assert extrapolated_seconds((8, 36e-6), 8 * MAX_EXTRAPOLATION) == 36e-6 * MAX_EXTRAPOLATION
    assert extrapolated_seconds((8, 36e-6), 64 << 20) == 0.0


# ------------------------------------------------------------------ the rows' JSON
NUMBER = st.floats(allow_nan=False, min_value=0) | st.integers(0, 10 ** 9)
ROWS = st.builds(CollectiveRow, backend=st.sampled_from(["gloo", "reference"]), world_size=st.integers(1, 8),
                 collective=st.sampled_from(["all_reduce", "broadcast"]), size=st.integers(1, 1 << 30),
                 count=st.integers(1, 1 << 28), dtype=st.sampled_from(["float32", "int8"]),
                 redop=st.sampled_from(["sum", "none"]), root=st.sampled_from([0, -1]), p50_us=NUMBER, p99_us=NUMBER,
                 algbw=NUMBER, busbw=NUMBER, bus_factor=NUMBER, wrong=st.integers(0, 99), iters=st.integers(1, 100),
                 warmup=st.integers(1, 5), wall_s=NUMBER)


@settings(max_examples=60, deadline=None)
@given(row=ROWS)
def test_collective_rows_round_trip_through_the_files_json(row):
    """to_json writes collectives.json's keys, in its order (time_us and p50_us both the p50; "#wrong"; "type"),
    and from_json reads them back to the same row."""
    data = json.loads(json.dumps(row.to_json()))
    assert list(data) == ["backend", "world_size", "collective", "size", "count", "type", "redop", "root", "time_us",
                          "p50_us", "p99_us", "algbw", "busbw", "bus_factor", "#wrong", "iters", "warmup", "wall_s"]
    assert data["time_us"] == data["p50_us"] and CollectiveRow.from_json(data) == row
    assert {key for _, key in COLLECTIVE_COLUMNS} <= set(data)  # reports/benchmarks.py's CSV reads these keys


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.one_of(st.binary(max_size=40), st.builds(lambda d: json.dumps(d).encode(), JSONISH)),
       row=ROWS, which=st.integers(0, 17), mutate=st.sampled_from(["drop", "retype"]))
def test_reading_a_file_that_is_not_a_collectives_json_is_a_record_error(tmp_path, document, row, which, mutate):
    """Any bytes: read_collectives returns rows or raises RecordError naming the file; a real row with one key
    dropped or given a wrong type names that key."""
    path = tmp_path / "collectives.json"
    path.write_bytes(document)
    try:
        read_collectives(str(path))
    except RecordError as exc:
        assert str(path) in str(exc)
    data = row.to_json()
    check_refused_key(path, read_collectives, data, list(data)[which], mutate)


def check_refused_key(path, reader, data: dict, key: str, mutate: str) -> None:
    """A real record's JSON ``data`` with ``key`` dropped or given a wrong type: ``reader`` refuses the file
    naming the record and the key (also used by tests/test_stress_rpc.py)."""
    data = dict(data)
    if mutate == "drop":
        del data[key]
    else:
        data[key] = "text" if not isinstance(data[key], str) else 1
    path.write_text(json.dumps({"records": [data]}))
    with pytest.raises(RecordError, match=f"record 0.*'{key}'"):
        reader(str(path))
