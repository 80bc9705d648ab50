"""Run modes (issue 25): device-qualified and mixed --backend strings, --init lazy|eager, and whether a
DETAIL world's backend was really wrapped by torch's collective-checking wrapper."""

from __future__ import annotations

import dataclasses

import pytest

from backends.builtin import BUILTIN_SPECS, GLOO_GAPS
from backends.mixed import (DEFAULT_BACKEND_ANSWERS, SEVERAL_BACKENDS_NO_RECONFIGURE, BadBackendString,
                            QUALIFIED_GAPS, UNDEFINED_DEFAULT_BACKEND, device_spec, given_string, parse,
                            split_backend_option, target_names)
from backends.registry import BackendRegistry, UnknownBackend
from fixtures.errors import WorldStartError
from fixtures.pytest_plugin import Target, _backend_names, _parse_init_modes, _refuse_unusable_backends, _skip_reason
from fixtures.world import World
from reports import views
from reports.markdown import _header
from reports.records import CaseRecord
from tests.harness_cases import run_mode_fns
from tests.harness_cases.procs import run_pytest

NCCL_HERE = BUILTIN_SPECS["nccl"].availability().available
MIXED = "cpu:gloo,cuda:nccl"


# ------------------------------------------------------------ --backend strings
def test_a_qualified_part_joins_the_string_before_it_unless_that_names_its_device():
    assert split_backend_option("gloo,cpu:gloo,cuda:nccl,cpu:reference") == ["gloo", MIXED, "cpu:reference"]
    assert split_backend_option(" cpu:gloo , cuda:nccl ") == [MIXED]
    assert split_backend_option("cpu:gloo,cpu:reference") == ["cpu:gloo", "cpu:reference"]
    assert split_backend_option("gloo,,reference") == ["gloo", "reference"]


def test_a_string_naming_several_devices_is_one_target_per_device_named_as_given():
    assert target_names("gloo") == ["gloo"]
    assert target_names("cpu:reference") == ["cpu:reference"]
    assert target_names(MIXED) == [f"{MIXED}@cpu", f"{MIXED}@cuda"]
    assert [given_string(n) for n in ("gloo", "cpu:gloo", f"{MIXED}@cuda")] == ["gloo", "cpu:gloo", MIXED]


@pytest.mark.parametrize("text, says", [("cpu:", "is not DEVICE:BACKEND"), (":gloo", "is not DEVICE:BACKEND"),
                                        ("cpu:gloo,cpu:nccl", "names device 'cpu' twice")])
def test_a_malformed_string_is_refused_naming_the_part(text, says):
    with pytest.raises(BadBackendString, match=says):
        parse(text)
    with pytest.raises(UnknownBackend, match=says):
        BackendRegistry().get(text)


def test_a_bad_backend_option_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="--backend"):
        _backend_names("cpu:")
    with pytest.raises(pytest.UsageError, match="no backend given"):
        _backend_names(" , ")
    with pytest.raises(UnknownBackend, match="unknown backend 'glooo'"):
        BackendRegistry().get("cpu:glooo")


def test_each_device_gets_the_spec_of_the_backend_serving_it():
    registry = BackendRegistry()
    cpu, cuda = registry.get(f"{MIXED}@cpu"), registry.get(f"{MIXED}@cuda")
    assert (cpu.name, cpu.device_type, cuda.device_type) == (f"{MIXED}@cpu", "cpu", "cuda")
    assert cpu.all_gaps[:len(QUALIFIED_GAPS)] == QUALIFIED_GAPS and all(g in cpu.all_gaps for g in GLOO_GAPS)
    assert all(g in cuda.all_gaps for g in BUILTIN_SPECS["nccl"].gaps) and GLOO_GAPS[0] not in cuda.all_gaps
    assert cuda.rank_env == cpu.rank_env or not NCCL_HERE  # NCCL's variables reach every world of the string
    if NCCL_HERE:
        assert cpu.init_backend == cuda.init_backend == MIXED
    else:  # torch refuses the whole string without NCCL: the CPU world runs without the part, the CUDA one not
        assert cpu.init_backend == "cpu:gloo" and "without cuda:nccl (torch was built without NCCL" in cpu.description
        assert cpu.availability().available
        assert cuda.availability().reason.startswith("cuda:nccl: torch was built without NCCL")
    single = registry.get("cpu:reference")
    assert (single.init_backend, single.device_type) == ("cpu:reference", "cpu")
    assert single.gap_for(feature="monitored_barrier") is QUALIFIED_GAPS[0]  # dist.get_backend() is not 'gloo'
    assert single.gap_for(feature="work_sequence_number") is None  # the reference is the first plugin registered
    assert cpu.gap_for(feature="work_sequence_number") is (None if NCCL_HERE else UNDEFINED_DEFAULT_BACKEND)
    assert "cpu:reference" not in registry.known  # strings are built from the known backends, not among them


def test_two_runnable_backends_in_a_string_get_what_torch_does_to_each_world():
    """cpu:reference,cuda:gloo: both worlds cannot reconfigure; the cpu one is answered by the default device's
    backend (gloo) and gets the reference's gaps beside other backends. A second plugin in a string (CUSTOM, like
    the first) never serves its device: that world is unavailable, saying which plugin serves it instead."""
    reference = BackendRegistry().get("reference")
    plugin = dataclasses.replace(reference, name="plug", device_type="dcdev", gaps=(), gaps_beside_other_backends=())
    lookup = {"reference": reference, "gloo": BUILTIN_SPECS["gloo"], "plug": plugin}.__getitem__
    cpu = device_spec("cpu:reference,cuda:gloo@cpu", lookup)
    assert SEVERAL_BACKENDS_NO_RECONFIGURE in cpu.gaps and DEFAULT_BACKEND_ANSWERS in cpu.gaps
    assert all(g in cpu.gaps for g in reference.gaps_beside_other_backends)
    assert DEFAULT_BACKEND_ANSWERS not in device_spec("cpu:reference,cuda:gloo@cuda", lookup).gaps
    two_plugins = "cpu:reference,dcdev:plug"
    second = device_spec(f"{two_plugins}@dcdev", lookup).availability()
    assert not second.available and "reference serves dcdev too" in second.reason and "CUSTOM" in second.reason
    first = device_spec(f"{two_plugins}@cpu", lookup)
    assert first.availability().available and DEFAULT_BACKEND_ANSWERS not in first.gaps  # its own type's slot
    assert SEVERAL_BACKENDS_NO_RECONFIGURE not in device_spec("cpu:gloo,cuda:gloo@cpu", lookup).gaps


def test_a_mixed_string_runs_while_one_of_its_devices_can():
    unusable = Target(f"{MIXED}@cuda", 2, "backend ... unavailable: cuda:nccl: no NCCL")
    _refuse_unusable_backends([Target(f"{MIXED}@cpu", 2), unusable])
    with pytest.raises(pytest.UsageError, match="cuda:nccl: no NCCL"):
        _refuse_unusable_backends([unusable])


def test_a_qualified_world_is_initialised_with_its_string():
    """The ranks' default group is created with the string (what dist.get_backend() answers), and the backend
    serving the rank's device is the named one."""
    world = World(BackendRegistry().get("cpu:gloo"), 2, ("cpu",) * 2).start()
    try:
        assert world.run(run_mode_fns.backend_string_and_cpu_backend) == [("cpu:gloo", "ProcessGroupGloo", 3.0)] * 2
    finally:
        world.close()


# ------------------------------------------------------------------- --init
def test_init_modes_parse_in_order_without_duplicates():
    assert _parse_init_modes("lazy") == ["lazy"]
    assert _parse_init_modes("EAGER, lazy,eager") == ["eager", "lazy"]
    for text in ("soon", " , "):
        with pytest.raises(pytest.UsageError, match="--init"):
            _parse_init_modes(text)


def test_ids_and_world_names_carry_eager_init_only():
    assert Target("gloo", 2).id == "gloo-ws2"
    assert Target("gloo", 2, init="eager").id == "gloo-ws2-eager"
    assert Target("nccl", 2, debug_level="DETAIL", init="eager").id == "nccl-ws2-DETAIL-eager"
    gloo = BackendRegistry().get("gloo")
    assert World(gloo, 2, ("cpu",) * 2, init="eager").name == "gloo-ws2-eager"


def test_eager_init_on_cpu_is_a_skip_saying_torch_refuses_it():
    class Pool:
        def cannot_host(self, spec, world_size):
            return ""

    gloo = BackendRegistry().get("gloo")
    assert _skip_reason(gloo, 2, Pool(), "lazy") == ""
    assert "torch refuses init_process_group(device_id=cpu)" in _skip_reason(gloo, 2, Pool(), "eager")


def test_an_eager_world_gives_init_process_group_the_ranks_device():
    """Forced onto CPU anyway, the ranks pass device_id=cpu and torch's own refusal comes back."""
    world = World(BackendRegistry().get("gloo"), 2, ("cpu",) * 2, init="eager", startup_deadline=30.0)
    with pytest.raises(WorldStartError, match="device_id parameter must be an accelerator"):
        world.start()


# ------------------------------------------------------------------ reports
def _record(backend, level="OFF", effect="", init="lazy", outcome="passed") -> CaseRecord:
    return CaseRecord(nodeid=f"suites/c10d/test_x.py::test_x[{backend}]", area="c10d", clause="x", backend=backend,
                      world_size=2, outcome=outcome, debug_level=level, debug_effect=effect, init=init)


def test_a_level_not_in_effect_is_named_in_rows_columns_and_the_summary():
    records = [_record("gloo", "DETAIL"), _record("reference", "DETAIL", "DETAIL not in effect: not wrapped"),
               _record("gloo", init="eager")]
    assert [views.target(r) for r in records] == [
        "gloo · debug DETAIL", "reference · debug DETAIL (not in effect)", "gloo · init eager"]
    assert views.column(records[1]).label == "reference ws2 DETAIL (not in effect)"
    assert views.levels_not_in_effect(records) == {"reference ws2 DETAIL": "DETAIL not in effect: not wrapped"}
    header = "\n".join(_header(records, {"inits": "eager,lazy", "debug_levels": "DETAIL,OFF"}))
    assert "init: `eager,lazy`" in header
    assert "- reference ws2 DETAIL: DETAIL not in effect: not wrapped" in header


def test_a_run_names_mixed_worlds_and_levels_not_in_effect(tmp_path):
    """One cheap clause on a mixed string and the reference at DETAIL: the CPU world of the string runs (torch
    wraps its gloo), its CUDA world is reported with its reason, and the reference's DETAIL is reported as not in
    effect (a Python ProcessGroup subclass is not wrapped) in conformance.json and summary.md."""
    run = run_pytest(["suites/c10d/test_all_reduce.py", "-k", "test_all_reduce_async and float32", "-n", "0",
                      "--backend", f"{MIXED},reference", "--world-size", "2", "--debug-level", "DETAIL"], tmp_path)
    assert run.returncode == 0, run.output
    cases = {case["nodeid"].split("[")[1].split("-ws2")[0]: case for case in run.report()["cases"]}
    assert sorted(cases) == sorted([f"{MIXED}@cpu", f"{MIXED}@cuda", "reference"])
    assert (cases[f"{MIXED}@cpu"]["outcome"], cases[f"{MIXED}@cpu"]["debug_effect"]) == ("passed", "")
    if not NCCL_HERE:
        assert cases[f"{MIXED}@cuda"]["outcome"] == "skipped"
        assert "cuda:nccl: torch was built without NCCL" in cases[f"{MIXED}@cuda"]["reason"]
    assert "ReferenceProcessGroup on cpu is not wrapped" in cases["reference"]["debug_effect"]
    assert list(run.report()["meta"]["debug_levels_not_in_effect"]) == ["reference ws2 DETAIL"]
    summary = run.read("summary.md")
    assert "- reference ws2 DETAIL: DETAIL not in effect" in summary
    assert f"| {MIXED}@cpu · debug DETAIL | c10d | 1 |" in summary
    assert "| reference · debug DETAIL (not in effect) | c10d | 1 |" in summary


def test_a_qualified_detail_world_is_resynchronised_after_partial_p2p(monkeypatch):
    """cpu:gloo's group has no default backend to give a sequence number (UNDEFINED_DEFAULT_BACKEND), so the
    harness asks the backend serving the rank's device; without that the next case's all_reduce failed with
    'Detected mismatch between collectives on ranks' (observed at ws3 under DETAIL)."""
    from fixtures.debug_level import resync_after_case, sequence_number
    from tests.harness_cases import debug_fns

    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    world = World(BackendRegistry().get("cpu:gloo"), 3, ("cpu",) * 3, debug_level="DETAIL").start()
    try:
        world.run(debug_fns.send_rank0_to_rank1)
        assert world.run(sequence_number) == [1, 1, 0]
        resync_after_case(world)
        assert world.run(debug_fns.all_reduce_ranks) == [6.0] * 3
    finally:
        world.close()


def test_nccl_splits_under_eager_init_only():
    """torch refuses split_group without a device bound by init_process_group(device_id=...): a lazy world's gap,
    held only where the ranks' DISTCONFORM_INIT says lazy (Target.rank_env)."""
    nccl = BUILTIN_SPECS["nccl"]
    assert "No device associated with the default pg" in nccl.gap_for(env=Target("nccl", 2).rank_env,
                                                                        feature="splitting").reason
    assert nccl.gap_for(env=Target("nccl", 2, init="eager").rank_env, feature="splitting") is None


def test_init_modes_are_an_axis_of_the_parallel_clauses_and_eager_needs_an_accelerator(tmp_path):
    """DeviceMesh clauses get a case per --init mode; a CPU run asking eager only stops with torch's reason."""
    run = run_pytest(["suites/parallel/test_dtensor.py", "-k", "test_device_mesh_dims", "--collect-only", "-q",
                      "--init", "lazy,eager", "--allow-unavailable", "--world-size", "2", "-n", "0"], tmp_path / "both")
    assert run.returncode == 0, run.output
    ids = {line.split("[")[1].split("-ws2")[0] + ("-eager" if "-eager" in line else "")
           for line in run.output.splitlines() if "::test_device_mesh_dims[" in line}
    assert ids == {"gloo", "gloo-eager"}
    run = run_pytest(["suites/parallel/test_dtensor.py", "--collect-only", "-q", "--init", "eager",
                      "--world-size", "2", "-n", "0"], tmp_path / "eager")
    assert run.returncode == 4 and "torch refuses init_process_group(device_id=cpu)" in run.output, run.output
