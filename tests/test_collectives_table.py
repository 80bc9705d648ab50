"""suites/collectives.py: one table of collectives, and every reader reads it.

Readers: the differential suite (suites/c10d/differential.py and its clause),
the timeout clause (suites/c10d/test_timeouts.py), the dtype clauses
(suites/c10d/test_dtypes.py), the entry-point clause
(suites/c10d/test_entry_points.py), the coalescing and functional clauses
(suites/c10d/test_coalescing.py, suites/parallel/test_functional.py), the
benchmark's rank side (suites/stress/rank_bench.py), its arithmetic
(suites/stress/metrics.py) and its CLI (suites/stress/collectives.py). Every
entry of the table is exercised by the dtype, entry-point and differential
clauses (a record that no dtype clause moves or reduces fails here), every
one runs in the differential and in the benchmark on a live world, and a
collective added as one entry (tests/harness_cases/extra_collective.py)
reaches all of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from backends.registry import BackendRegistry
from backends.spec import BackendSpec, check_requirement_keys
from fixtures.pool import WorldPool
from suites import collectives
from suites.c10d import differential
from suites.c10d.differential import Call
from suites.stress import metrics
from suites.stress.rank_bench import bench_row, expected_output, fill_modulus, rank_input
from tests.harness_cases import warm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTRA = "tests.harness_cases.extra_collective"
RUN_TIMEOUT_S = 300

# nccl-tests' bus factors by collective (src/*.cu): every form of a family has its family's
NCCL_TESTS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n, "gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0,
}


# ------------------------------------------------------------------ the records
def test_records_are_consistent():
    bench = collectives.bench_names()
    assert len(bench) == len(set(bench)), f"two collectives share a benchmark name: {bench}"
    for name, entry in collectives.TABLE.items():
        assert entry.name == name
        check_requirement_keys(entry.need(), name)
        assert entry.flow in (collectives.ALL_TO_ALL, collectives.FROM_ROOT, collectives.TO_ROOT), name
        assert set(entry.splits) <= {"even", "uneven"}, name
        assert entry.in_place == (entry.outputs is None), name


@pytest.mark.parametrize("name", collectives.names())
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_bus_factor_is_nccl_tests(name, n):
    entry = collectives.get(name)
    assert metrics.bus_factor(entry, n) == pytest.approx(NCCL_TESTS_FACTOR[entry.family](n))


def test_unknown_collective_names_the_known_ones():
    with pytest.raises(collectives.UnknownCollective, match="unknown collective 'all_sum'.*all_reduce"):
        collectives.get("all_sum")
    with pytest.raises(ValueError, match="unknown collective 'all_sum'"):
        metrics.entry("all_sum")


def test_every_collective_is_drawn_by_the_differential():
    combos = __import__("suites.c10d.test_differential", fromlist=["allowed_combos"]).allowed_combos(
        BackendSpec(name="toy"), 3)
    drawn = {(c[0], c[1]) for c in combos}
    for name, entry in collectives.TABLE.items():
        for split in entry.splits or (None,):
            assert (name, split) in drawn, f"{name} (split {split}) is never drawn"


@pytest.mark.parametrize("collective", collectives.bench_names())
@pytest.mark.parametrize("n", [1, 2, 3])
def test_periodic_expectation_equals_the_oracle_on_full_inputs(collective, n):
    """The benchmark's shortcut (one period per chunk, tiled) equals the table's oracle on the full chunks."""
    entry = metrics.entry(collective)
    for nbytes in (8, 1000, 4096):
        for dtype in (torch.float32, torch.int32):
            modulus = fill_modulus(dtype, n)
            lay = metrics.layout(entry, nbytes, n, dtype.itemsize)
            parts = entry.inputs.count(n)
            full_in = [list(rank_input(r, lay.in_numel, dtype, modulus).chunk(parts))
                       if entry.inputs.passed_by(r == 0) else [] for r in range(n)]
            full = entry.oracle(full_in, "sum" if entry.reduces else None, 0 if entry.rooted else None)
            for rank in range(n):
                got = expected_output(entry, rank, n, lay, dtype, modulus)
                if not full[rank] or full[rank][0] is None:
                    assert got is None
                else:
                    assert torch.equal(got, torch.cat(full[rank])), (collective, n, nbytes, dtype, rank)
                    assert got.numel() == lay.out_numel


# ------------------------------------------------------------ every entry, every clause
def parametrized(module, test_name: str, argname: str) -> list:
    """The values ``module.test_name`` is parametrized with for ``argname`` (first of several argnames)."""
    values = []
    for mark in getattr(module, test_name).pytestmark:
        names = [n.strip() for n in mark.args[0].split(",")] if mark.name == "parametrize" else []
        if names and names[0] == argname:
            values += [v.values[0] if hasattr(v, "values") else v for v in mark.args[1]]
    return values


def clause_ids(module, test_name: str) -> set[str]:
    """The parameter ids of ``module.test_name`` (the ones pytest.param gave explicitly)."""
    ids = set()
    for mark in getattr(module, test_name).pytestmark:
        if mark.name == "parametrize":
            ids.update(v.id for v in mark.args[1] if getattr(v, "id", None))
    return ids


def dtype_clause_collectives(test_dtypes) -> set[str]:
    """The table collectives the dtype clauses of suites/c10d/test_dtypes.py run."""
    return {v for test in ("test_complex_moves_bit_for_bit", "test_float8_moves_bit_for_bit",
                           "test_narrow_int_moves_bit_for_bit", "test_complex_reduce_and_reduce_scatter",
                           "test_premul_sum")
            for v in parametrized(test_dtypes, test, "operation" if "moves" in test else "collective")}


def uncovered(table: dict) -> list[str]:
    """Every (collective, clause) of ``table`` that the clause files, as imported now, do not exercise."""
    from suites.c10d import test_coalescing, test_dtypes, test_entry_points
    from suites.c10d.test_differential import allowed_combos
    from suites.parallel import test_functional

    moved = dtype_clause_collectives(test_dtypes)
    entry_points = clause_ids(test_entry_points, "test_entry_point")
    drawn = {c[0] for c in allowed_combos(BackendSpec(name="toy"), 3)}
    managed = set(parametrized(test_coalescing, "test_coalescing_manager_with_device", "collective"))
    functional = set(parametrized(test_functional, "test_funcol_backward", "collective"))
    missing = []
    for name, entry in table.items():
        wanted = {
            "a dtype clause": name in moved,
            "the differential": name in drawn,
            "the coalescing manager clause": not entry.coalesced.manager or name in managed,
            "the functional backward clause": entry.functional is None or name in functional,
        }
        for entry_point in entry.entry_point_names + ((entry.coalesced.function,) if entry.coalesced.function else ()):
            wanted[f"the entry-point clause ({entry_point})"] = entry_point in entry_points
        if entry.coalesced.manager:
            wanted["the entry-point clause (coalescing manager)"] = f"coalescing_manager_{name}" in entry_points
        missing += [f"{name}: not run by {clause}" for clause, covered in wanted.items() if not covered]
    return missing


def test_every_entry_is_exercised_by_the_dtype_entry_point_and_differential_clauses():
    assert uncovered(collectives.TABLE) == []


def test_an_entry_no_clause_runs_is_caught():
    """The coverage check itself: an entry without dtype groups, or whose entry point no case calls, is named."""
    import dataclasses

    lonely = dataclasses.replace(collectives.get("broadcast"), name="lonely_broadcast", dtypes_moved=(),
                                 entry_points=("broadcast_but_elsewhere",))
    missing = uncovered({"lonely_broadcast": lonely})
    assert "lonely_broadcast: not run by a dtype clause" in missing, missing
    assert "lonely_broadcast: not run by the differential" in missing, missing
    assert "lonely_broadcast: not run by the entry-point clause (broadcast_but_elsewhere)" in missing, missing


def test_dtype_groups_and_adjoints_are_the_tables_own_words():
    for name, entry in collectives.TABLE.items():
        assert set(entry.dtypes_moved) <= set(collectives.MOVED_DTYPES), name
        assert set(entry.dtypes_reduced) <= set(collectives.REDUCED_DTYPES), name
        assert not entry.dtypes_reduced or entry.reduces, f"{name} reduces dtypes but takes no reduce op"
        assert not entry.dtypes_moved or not entry.reduces, f"{name} moves dtypes but reduces"
        if entry.functional is not None:
            adjoint = collectives.get(entry.functional.adjoint)
            assert adjoint.functional is not None, f"{name}'s adjoint {adjoint.name} has no functional form"
        if entry.coalesced.function:
            assert entry.coalesced.call is not None, name
    claimed = [p for e in collectives.TABLE.values()
               for p in e.entry_point_names + ((e.coalesced.function,) if e.coalesced.function else ())]
    assert len(claimed) == len(set(claimed)), f"an entry point claimed twice: {claimed}"


# ------------------------------------------------------------ on live worlds
@pytest.fixture(scope="module")
def pool():
    pool = WorldPool(BackendRegistry(), deadline=60.0)
    yield pool
    pool.close_all()


def call_for(entry, world_size: int, **changes) -> Call:
    return Call(operation=entry.name, op="sum" if entry.reduces else None, dtype="float32",
                shape=(2, 3) if not changes.get("splits") else (0, 3), root=world_size - 1 if entry.rooted else None,
                seed=7, world_size=world_size, **changes)


@pytest.mark.parametrize("backend, world_size", [("gloo", 3), ("reference", 2)])
def test_every_collective_runs_in_the_differential_and_the_benchmark(pool, backend, world_size):
    from suites.c10d.test_differential import check_call

    world = pool.get(backend, world_size)
    for entry in collectives.TABLE.values():
        calls = [call_for(entry, world_size, backend=backend), call_for(entry, world_size, backend=backend,
                                                                        group=(0, world_size - 1))]
        if "uneven" in entry.splits:
            calls.append(call_for(entry, world_size, backend=backend,
                                  splits=tuple(tuple((i + j) % 3 for j in range(world_size)) for i in range(world_size))))
        for call in calls:
            check_call(world, call)  # raises with the call on any difference from the oracle
        rows = world.run(bench_row, entry, 256, "float32", warmup=1, max_iters=2, min_iters=1,
                         target_seconds=0.001)
        assert [r["wrong"] for r in rows] == [0] * world_size, (entry.name, rows)
        assert rows[0]["size"] == metrics.layout(entry, 256, world_size, 4).size


# ------------------------------------------------------------ one entry, every reader
@pytest.fixture
def extra_entry():
    """tests/harness_cases/extra_collective.py's entry in this process's table, removed afterwards."""
    import importlib

    module = importlib.import_module(EXTRA)
    collectives.TABLE.setdefault(module.NAME, module.ENTRY)
    yield module.ENTRY
    collectives.TABLE.pop(module.NAME, None)


@pytest.fixture
def clause_modules_with_extra(extra_entry):
    """The clause modules re-imported with the extra entry in the table (their cases are made at import),
    and re-imported once more without it afterwards."""
    import importlib

    from suites.c10d import test_coalescing, test_dtypes, test_entry_points
    from suites.parallel import test_functional

    modules = (test_dtypes, test_entry_points, test_coalescing, test_functional)
    for module in modules:
        importlib.reload(module)
    yield extra_entry
    collectives.TABLE.pop(extra_entry.name, None)
    for module in modules:
        importlib.reload(module)


def test_an_entry_added_to_the_table_reaches_every_reader(clause_modules_with_extra):
    from suites.c10d import test_dtypes, test_entry_points
    from suites.c10d.test_differential import allowed_combos
    from suites.c10d.test_timeouts import cases
    from suites.stress.collectives import parse_args

    extra = clause_modules_with_extra
    name = extra.name
    assert uncovered({name: extra}) == []
    assert name in parametrized(test_dtypes, "test_complex_reduce_and_reduce_scatter", "collective")
    assert name in parametrized(test_dtypes, "test_premul_sum", "collective")
    assert "_reduce_scatter_base" in clause_ids(test_entry_points, "test_entry_point")
    assert name in differential.operations()
    assert name in {c[0] for c in allowed_combos(BackendSpec(name="toy"), 2)}
    assert Call(name, "sum", "float32", (3,)).need() == {
        "collective": "reduce_scatter", "form": "base", "op": "sum", "dtype": "float32", "layout": "contiguous",
        "shape": "1d"}
    assert name in [c[1] for c in cases()]
    assert name in metrics.collective_names()
    assert metrics.bus_factor(metrics.entry(name), 4) == pytest.approx(0.75)
    assert metrics.layout(metrics.entry(name), 64, 4, 4).count == 16
    assert parse_args(["--collectives", name]).collective_records == [extra]
    assert name in parse_args(["--collectives", "all"]).collective_list
    # and its requirement is matched like any other: a gap on the form excuses it only
    gappy = BackendSpec(name="toy", gaps=(__import__("backends.spec", fromlist=["Gap"]).Gap(
        {"collective": "reduce_scatter", "form": "base"}, "no _reduce_scatter_base"),))
    assert name not in {c[0] for c in allowed_combos(gappy, 2)}
    assert "reduce_scatter_tensor" in {c[0] for c in allowed_combos(gappy, 2)}


def _run(cmd: list[str], **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "DISTCONFORM_SESSION")}
    env.update(env_extra)
    return warm.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def test_an_added_entry_is_measured_by_the_benchmark(tmp_path):
    proc = _run([sys.executable, "-m", "suites.stress.collectives", "--backend", "gloo", "--world-size", "2",
                 "--backend-plugin", EXTRA, "--collectives", "reduce_scatter_base", "--max-bytes", "64",
                 "--iters", "2", "--report-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "collectives.json").read_text())
    rows = [r for r in report["records"] if r["collective"] == "reduce_scatter_base"]
    assert rows and all(r["#wrong"] == 0 and r["redop"] == "sum" for r in rows), rows


def test_an_added_entry_is_checked_by_every_clause_that_runs_it(tmp_path):
    """On gloo, with the plugin: the differential (one replayed call), the timeout clause, the entry-point
    clause, its late-rank twin and the dtype clauses each run the added collective, and it passes (or meets gloo's declared gaps)."""
    call = Call("reduce_scatter_base", "max", "int64", (2, 3), group=(0, 1), seed=3, world_size=2, backend="gloo")
    base = [sys.executable, "-m", "pytest", "--backend", "gloo", "--world-size", "2", "--backend-plugin", EXTRA,
            "-q", "-p", "no:cacheprovider", "--report-dir", str(tmp_path / "report")]
    proc = _run(base + ["suites/c10d/test_differential.py", "suites/c10d/test_timeouts.py",
                        "suites/c10d/test_entry_points.py", "suites/c10d/test_dtypes.py", "-k",
                        "differential or reduce_scatter_base"], DISTCONFORM_REPLAY=repr(call))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = json.loads((tmp_path / "report" / "conformance.json").read_text())["cases"]
    ran = {}
    for case in cases:
        if "reduce_scatter_base" in case["nodeid"] or "test_differential" in case["nodeid"]:
            ran.setdefault(case["nodeid"].split("::")[1].split("[")[0], set()).add(case["outcome"])
    assert set(ran) == {"test_differential", "test_skipped_collective_raises_within_group_timeout",
                        "test_late_rank_within_group_timeout_succeeds",
                        "test_entry_point", "test_complex_reduce_and_reduce_scatter", "test_premul_sum"}, ran
    assert all(outcomes <= {"passed", "xfailed"} for outcomes in ran.values()), ran
    assert {"passed"} <= ran["test_complex_reduce_and_reduce_scatter"] and ran["test_entry_point"] == {"passed"}, ran


def test_every_record_with_group_methods_says_how_to_call_them():
    """suites/c10d/test_method_names.py calls group_methods through the record's group_call: both or neither."""
    from suites import collectives

    for entry in collectives.TABLE.values():
        assert bool(entry.group_methods) == (entry.group_call is not None), entry.name
