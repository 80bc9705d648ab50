"""backends/spec.py and backends/registry.py: capability gaps and backend lookup."""

import pytest
import torch
import torch.distributed as dist

from backends.builtin import BUILTIN_SPECS
from backends.registry import BackendRegistry, PluginImportError, UnknownBackend, load_plugin
from dataclasses import replace

from backends.spec import Availability, BackendSpec, Gap, inherit
from tests.harness_cases import warm


# ------------------------------------------------------------------ Gap
def test_gap_matches_exact_values():
    gap = Gap({"collective": "all_reduce", "op": "avg"}, "no avg")
    assert gap.matches({"collective": "all_reduce", "op": "avg"})
    assert gap.matches({"collective": "all_reduce", "op": "avg", "dtype": "int32"})  # extra keys are fine
    assert not gap.matches({"collective": "all_reduce", "op": "sum"})
    assert not gap.matches({"collective": "broadcast", "op": "avg"})


@pytest.mark.parametrize("values", [("band", "bor"), {"band", "bor"}, frozenset({"band", "bor"}), ["band", "bor"]])
def test_gap_matches_any_value_of_a_collection(values):
    gap = Gap({"op": values}, "no bitwise")
    assert gap.matches({"op": "band"})
    assert gap.matches({"op": "bor", "collective": "reduce"})
    assert not gap.matches({"op": "bxor"})
    assert not gap.matches({"op": "sum"})


def test_gap_missing_key_does_not_match():
    gap = Gap({"collective": "all_reduce", "layout": "non_contiguous"}, "strided views")
    assert not gap.matches({"collective": "all_reduce"})
    assert not gap.matches({"layout": "non_contiguous"})
    assert not gap.matches({})


def test_gap_defaults_to_xfail():
    assert Gap({"op": "avg"}, "r").outcome == "xfail"


# ------------------------------------------------------------ gap_for
SPEC = BackendSpec(
    name="toy",
    gaps=(
        Gap({"collective": "all_reduce", "dtype": "float32", "op": "sum"}, "first"),
        Gap({"op": ("band", "bxor")}, "bitwise", outcome="skip"),
        Gap({"dtype": "float32"}, "any float32"),
    ),
)


def test_gap_for_normalises_torch_dtype_and_reduce_op():
    gap = SPEC.gap_for(collective="all_reduce", dtype=torch.float32, op=dist.ReduceOp.SUM)
    assert gap is not None and gap.reason == "first"


@pytest.mark.parametrize("op, expected", [(dist.ReduceOp.BAND, "bitwise"), (dist.ReduceOp.BXOR, "bitwise"),
                                          ("band", "bitwise"), (dist.ReduceOp.BOR, None), ("sum", None)])
def test_gap_for_reduce_ops_and_strings_agree(op, expected):
    gap = SPEC.gap_for(collective="broadcast", op=op, dtype=torch.int64)
    assert (gap.reason if gap else None) == expected


def test_gap_for_first_match_wins_and_none_values_are_ignored():
    assert SPEC.gap_for(collective="broadcast", dtype=torch.float32).reason == "any float32"
    assert SPEC.gap_for(collective="all_reduce", dtype="float32", op="sum").reason == "first"
    assert SPEC.gap_for(collective="all_reduce", dtype="float32", op=None).reason == "any float32"
    assert SPEC.gap_for(collective="all_reduce", dtype=torch.float64, op=dist.ReduceOp.SUM) is None
    assert SPEC.gap_for() is None


def test_gap_for_outcome_is_the_gaps():
    assert SPEC.gap_for(op=dist.ReduceOp.BXOR).outcome == "skip"


def test_builtin_gloo_gap_covers_non_contiguous_all_reduce_only():
    gloo = BUILTIN_SPECS["gloo"]
    assert gloo.gap_for(collective="all_reduce", layout="non_contiguous", dtype=torch.float32, op="sum")
    assert gloo.gap_for(collective="all_reduce", layout="contiguous", dtype=torch.float32) is None
    assert gloo.gap_for(collective="all_reduce", dtype=torch.float32, op=dist.ReduceOp.SUM) is None


def test_availability_probe_that_raises_is_unavailable():
    def broken():
        raise RuntimeError("driver exploded")

    spec = BackendSpec(name="broken", check_available=broken)
    availability = spec.availability()
    assert availability == Availability(False, availability.reason)
    assert "driver exploded" in availability.reason


# ----------------------------------------------------------- registry
def test_registry_knows_the_builtin_backends():
    registry = BackendRegistry()
    for name in ("gloo", "nccl", "mpi", "ucc"):
        assert registry.get(name).name == name
    assert registry.get("gloo").device_type == "cpu"
    assert registry.get("nccl").device_type == "cuda"


def test_gloo_cuda_is_torch_gloo_on_shared_gpus_with_gloo_gaps():
    """The gloo-cuda target (fixtures/gpu_check.py): torch's gloo, CUDA tensors, ranks sharing GPUs."""
    spec = BackendRegistry().get("gloo-cuda")
    assert (spec.init_backend, spec.device_type, spec.shares_devices) == ("gloo", "cuda", True)
    assert BackendRegistry().get("gloo").init_backend == "gloo"
    gap = spec.gap_for(collective="all_reduce", layout="non_contiguous")
    assert gap is not None and gap.source == "gloo"
    import torch

    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in spec.availability().reason


def test_unknown_backend_lists_known_names():
    registry = BackendRegistry()
    with pytest.raises(UnknownBackend) as info:
        registry.get("nosuch")
    text = str(info.value)
    assert "'nosuch'" in text
    known = text.split("known backends:", 1)[1]
    for name in ("gloo", "nccl", "mpi", "ucc"):
        assert name in known
    assert isinstance(info.value, ValueError)


def test_plugin_that_fails_to_import_is_a_plugin_import_error():
    with pytest.raises(PluginImportError, match="tests.harness_cases.bad_plugin.*marker-9931"):
        load_plugin("tests.harness_cases.bad_plugin")
    with pytest.raises(PluginImportError, match="no_such_module_xyz"):
        BackendRegistry(["tests.harness_cases.no_such_module_xyz"])


def test_plugin_without_spec_is_held_to_the_full_contract():
    registry = BackendRegistry(["tests.harness_cases.plugin_backend"])
    spec = registry.get("plugin_gloo")
    assert spec.has_spec is False
    assert spec.gaps == ()
    assert spec.device_type == "cpu"
    assert spec.availability().available
    # gloo's own gap must not leak to a plugin built on gloo
    assert spec.gap_for(collective="all_reduce", layout="non_contiguous") is None
    assert "plugin_gloo" in registry.known


# ------------------------------------------------------------ requirement keys
def test_every_builtin_and_agent_gap_is_in_the_vocabulary():
    from backends.rpc_agents import AGENTS
    from backends.spec import check_requirement_keys

    gaps = [g for spec in BackendRegistry().specs.values() for g in spec.all_gaps]
    gaps += [g for agent in AGENTS.values() for g in agent.gaps]
    assert gaps
    for gap in gaps:
        check_requirement_keys(gap.match, gap.reason)  # keys and closed values


def test_a_closed_keys_other_value_is_an_error_naming_key_value_and_the_known_ones():
    from backends.spec import UnknownRequirementValue

    with pytest.raises(UnknownRequirementValue, match=r"unknown form 'devcie'; known: list, single, device, "):
        Gap({"feature": "coalescing", "form": "devcie"}, "typo")
    with pytest.raises(UnknownRequirementValue, match=r"gap_for: unknown op 'prod'; known: sum, product"):
        SPEC.gap_for(op="prod")
    with pytest.raises(UnknownRequirementValue, match=r"unknown dtype 'float'"):
        Gap({"dtype": ("float32", "float")}, "one value of several")
    # torch objects are named as the vocabulary names them; open keys take any value
    assert SPEC.gap_for(dtype=torch.float64, op=dist.ReduceOp.PRODUCT) is None
    assert Gap({"bad_input": "anything", "backend": "a_plugin"}, "open keys").match


def test_the_vocabularys_values_are_what_torch_and_the_suites_name():
    from backends.spec import DTYPES, REQUIREMENT_KEYS
    from suites.ddp.impls import IMPLS

    assert all(isinstance(getattr(torch, name), torch.dtype) for name in DTYPES)
    assert IMPLS == REQUIREMENT_KEYS["impl"].values == ("torch", "reference")


def test_the_collective_tables_families_and_forms_are_known_entries_added_later_too(monkeypatch):
    """suites/collectives.py supplies its families and forms (spec.py cannot import it: it imports backends)."""
    from dataclasses import replace as replace_entry

    from backends.spec import UnknownRequirementValue, known_values
    from suites import collectives

    for entry in collectives.TABLE.values():
        assert entry.family in known_values("collective") and entry.form in (None, *known_values("form"))
        assert set(entry.splits) <= set(known_values("split")), entry.name
    with pytest.raises(UnknownRequirementValue, match=r"unknown form 'base'"):
        Gap({"collective": "reduce_scatter", "form": "base"}, "not in the table yet")
    added = replace_entry(collectives.TABLE["reduce_scatter_tensor"], name="reduce_scatter_base", form="base")
    monkeypatch.setitem(collectives.TABLE, added.name, added)
    assert Gap({"collective": "reduce_scatter", "form": "base"}, "in the table now").match


def test_parameters_named_like_a_key_state_it_with_a_value_of_the_key():
    from backends.spec import PARAMETER_KEYS, parameter_requirements

    assert "shape" in PARAMETER_KEYS and "bad_input" not in PARAMETER_KEYS
    params = {"shape": "empty", "dtype": torch.bfloat16, "op": dist.ReduceOp.SUM, "workload": "python_udf",
              "rpc_call": "remote", "world_target": object(), "case": "x"}
    assert parameter_requirements(params) == {"shape": "empty", "dtype": "bfloat16", "op": "sum",
                                              "workload": "python_udf", "rpc_call": "remote"}
    # a parameter named like a closed key but meaning something else in its test states nothing (DDP's mode
    # is no key at all)
    assert parameter_requirements({"mode": "small_buckets", "collective": "reduce_scatter_tensor",
                                   "shape": "4MiB"}) == {}
    # so a gap on a parametrised shape matches the case
    gap = Gap({"feature": "recv_any_source", "shape": "empty"}, "r")
    assert gap.matches({"feature": "recv_any_source", **parameter_requirements({"shape": "empty"})})


def test_a_gap_with_an_unknown_key_is_an_error_naming_it():
    from backends.spec import UnknownRequirementKey

    with pytest.raises(UnknownRequirementKey, match=r"unknown requirement key 'colective'.*known keys: collective"):
        Gap({"colective": "all_reduce"}, "typo")
    with pytest.raises(ValueError, match="outcome 'xfial'"):
        Gap({"collective": "all_reduce"}, "typo", outcome="xfial")
    with pytest.raises(UnknownRequirementKey, match="'opp'"):
        SPEC.gap_for(opp="sum")  # a test stating an unknown key fails as loudly


def test_a_plugin_whose_spec_has_an_unknown_key_fails_to_load_naming_it(tmp_path, monkeypatch):
    (tmp_path / "typo_plugin_x1.py").write_text(
        "from backends.spec import BackendSpec, Gap\n"
        "DISTCONFORM_SPEC = BackendSpec(name='typo_x1', gaps=(Gap({'layuot': 'non_contiguous'}, 'r'),))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginImportError, match=r"typo_plugin_x1.*unknown requirement key 'layuot'"):
        BackendRegistry(["typo_plugin_x1"])


def test_a_spec_with_an_unknown_feature_fails_to_load_naming_the_value(tmp_path, monkeypatch):
    from backends.spec import UnknownRequirementValue

    with pytest.raises(UnknownRequirementValue, match=r"Gap\(\{'feature': 'coalesing'\}.*unknown feature "
                                                      r"'coalesing'; known: subgroups, .*coalescing"):
        BackendSpec(name="typo_f1", gaps=(Gap({"feature": "coalesing"}, "r"),))
    with pytest.raises(UnknownRequirementValue, match=r"unknown feature 'teleport'"):  # one value of several
        BackendSpec(name="typo_f2", gaps=(Gap({"feature": ("subgroups", "teleport")}, "r"),))
    with pytest.raises(UnknownRequirementValue, match=r"gap_for: unknown feature 'subgroup'"):
        SPEC.gap_for(feature="subgroup")  # a test stating an unknown feature fails as loudly
    (tmp_path / "typo_plugin_f3.py").write_text(
        "from backends.spec import BackendSpec, Gap\n"
        "DISTCONFORM_SPEC = BackendSpec(name='typo_f3', gaps=(Gap({'feature': 'sprase'}, 'r'),))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginImportError, match=r"typo_plugin_f3.*unknown feature 'sprase'"):
        BackendRegistry(["typo_plugin_f3"])


def test_feature_keys_name_their_torch_flags():
    from backends.spec import FEATURES

    assert FEATURES["coalescing"] == "supports_coalescing"
    assert FEATURES["work_sequence_number"] == "supports_work_sequence_number"
    # the c10d Backend properties of this torch exist under the names we map to
    from torch._C._distributed_c10d import Backend

    for flag in ("supports_coalescing", "supports_splitting", "supports_time_estimate"):
        assert hasattr(Backend, flag), flag


# ------------------------------------------------- environment / torch version
DEBUG_GAP = Gap({"feature": "subgroups"}, "only without DETAIL", unless_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


def test_env_dependent_gap_holds_only_where_its_environment_says():
    assert DEBUG_GAP.holds(env={})
    assert DEBUG_GAP.holds(env={"TORCH_DISTRIBUTED_DEBUG": "INFO"})
    assert not DEBUG_GAP.holds(env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    needs_var = Gap({"feature": "subgroups"}, "only with X", env={"X": ("1", "2")})
    assert needs_var.holds(env={"X": "2"}) and not needs_var.holds(env={}) and not needs_var.holds(env={"X": "3"})
    unset = Gap({"feature": "subgroups"}, "only when X is unset", env={"X": None})
    assert unset.holds(env={}) and not unset.holds(env={"X": ""})
    assert DEBUG_GAP.conditions() == "holds with TORCH_DISTRIBUTED_DEBUG not DETAIL"


def test_gap_for_reads_the_process_environment_and_the_spec_rank_env(monkeypatch):
    spec = BackendSpec(name="toy_env", gaps=(DEBUG_GAP,))
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    assert spec.gap_for(feature="subgroups") is DEBUG_GAP
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    assert spec.gap_for(feature="subgroups") is None
    # what the ranks see wins: the spec's rank_env on top of the process environment
    ranks_set_it = BackendSpec(name="toy_env2", gaps=(DEBUG_GAP,), rank_env={"TORCH_DISTRIBUTED_DEBUG": "OFF"})
    assert ranks_set_it.gap_for(feature="subgroups") is DEBUG_GAP


def test_torch_version_dependent_gap():
    gap = Gap({"op": "avg"}, "on 2.13 only", torch=">=2.13,<2.14")
    assert gap.holds(env={}, torch_version="2.13.0+cpu")
    assert gap.holds(env={}, torch_version="2.13.1")
    assert not gap.holds(env={}, torch_version="2.14.0a0+git1234")
    assert not gap.holds(env={}, torch_version="2.12.1")
    this_torch = torch.__version__
    assert BackendSpec(name="t", gaps=(Gap({"op": "avg"}, "old", torch="<2.0"),)).gap_for(op="avg") is None
    assert BackendSpec(name="t", gaps=(Gap({"op": "avg"}, "now", torch=f">={this_torch.split('+')[0]}"),)
                       ).gap_for(op="avg") is not None
    with pytest.raises(ValueError, match="not a version specifier"):
        Gap({"op": "avg"}, "r", torch="2.13 or later")


def test_group_name_desync_gap_holds_from_torch_2_14_on_every_builtin_backend():
    """torch 2.14 counts hashed group names too; 2.11 and 2.13 do not (their locally synchronised groups are safe)."""
    from backends.registry import BackendRegistry
    from backends.spec import LOCAL_SYNC_DESYNCS_GROUP_NAMES as gap

    assert gap.holds(env={}, torch_version="2.14.1+cu130") and gap.holds(env={}, torch_version="2.15.0")
    assert not gap.holds(env={}, torch_version="2.13.0+cpu") and not gap.holds(env={}, torch_version="2.11.0")
    assert gap.outcome == "skip" and gap.loses_world
    registry = BackendRegistry()
    for name in ("gloo", "nccl", "mpi", "ucc", "reference"):
        assert gap in registry.get(name).all_gaps, name


def test_mark_gap_reason_names_owner_inheritance_and_conditions():
    from fixtures.pytest_plugin import mark_gap

    class Item:
        def __init__(self):
            self.markers, self.stash = [], {}

        def add_marker(self, marker):
            self.markers.append(marker)

    item = Item()
    mark_gap(item, replace(DEBUG_GAP, source="gloo"), "wrapped")
    (marker,) = item.markers
    assert marker.name == "xfail" and marker.kwargs["strict"] is True
    assert marker.kwargs["reason"] == ("wrapped (inherited from gloo): only without DETAIL "
                                       "[holds with TORCH_DISTRIBUTED_DEBUG not DETAIL]")


# ------------------------------------------------------------ inheritance
def test_a_spec_inherits_another_backends_gaps_after_its_own():
    registry = BackendRegistry(["tests.harness_cases.gloo_heir"])
    heir, gloo = registry.get("gloo_heir"), registry.get("gloo")
    assert heir.gaps == () and len(heir.all_gaps) == len(gloo.gaps)
    gap = heir.gap_for(collective="all_reduce", layout="non_contiguous")
    assert gap is not None and gap.source == "gloo" and gap.reason == gloo.gaps[1].reason
    own = Gap({"collective": "all_reduce", "layout": "non_contiguous"}, "the heir's own")
    assert inherit(replace(heir, gaps=(own,)), gloo).gap_for(collective="all_reduce", layout="non_contiguous") is own


def test_inheriting_an_unknown_backend_or_in_a_cycle_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "heirs_x2.py").write_text(
        "from backends.spec import BackendSpec\n"
        "DISTCONFORM_SPEC = [BackendSpec(name='a_x2', inherits='b_x2'), BackendSpec(name='b_x2', inherits='a_x2')]\n")
    (tmp_path / "orphan_x2.py").write_text(
        "from backends.spec import BackendSpec\n"
        "DISTCONFORM_SPEC = BackendSpec(name='orphan_x2', inherits='glooo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnknownBackend, match="'orphan_x2' inherits the gaps of unknown backend 'glooo'"):
        BackendRegistry(["orphan_x2"])
    with pytest.raises(UnknownBackend, match="cycle"):
        BackendRegistry(["heirs_x2"])


def test_gloo_gaps_apply_to_a_plugin_that_inherits_them(tmp_path):
    """End to end through --backend-plugin: the heir gets gloo's outcomes case by case, its xfails name gloo."""
    import json
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    report = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    proc = warm.run([sys.executable, "-m", "pytest", "suites/c10d/test_non_contiguous.py",
                     "suites/c10d/test_all_to_all.py", "--backend", "gloo,gloo_heir", "--backend-plugin",
                     "tests.harness_cases.gloo_heir", "--world-size", "2", "-q", "-p", "no:cacheprovider",
                     "--report-dir", str(report)], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    cases = json.loads((report / "conformance.json").read_text())["cases"]
    by = {b: {c["nodeid"].replace(f"[{b}-", "["): c for c in cases if c["backend"] == b} for b in ("gloo", "gloo_heir")}
    assert by["gloo"].keys() == by["gloo_heir"].keys()
    assert {k: c["outcome"] for k, c in by["gloo"].items()} == {k: c["outcome"] for k, c in by["gloo_heir"].items()}
    xfailed = [c for c in by["gloo_heir"].values() if c["outcome"] == "xfailed"]
    assert xfailed and all("gloo_heir (inherited from gloo): gloo" in c["reason"] for c in xfailed), xfailed


INTERMITTENT_CONFTEST = '''
from backends.spec import Gap
from fixtures.pytest_plugin import mark_gap

pytest_plugins = ["fixtures.pytest_plugin"]
GAP = Gap({"workload": "concurrent_calls"}, "shows in some runs", outcome="intermittent")


def pytest_collection_modifyitems(items):
    for item in items:
        mark_gap(item, GAP, "toy agent")
'''

INTERMITTENT_TESTS = '''
def test_deviation_absent():
    pass


def test_deviation_seen():
    assert 3 == 8, "3 of 8 calls brought their events back"


def test_error_is_never_excused():
    raise RuntimeError("boom")
'''


def test_an_intermittent_gap_excuses_an_assertion_failure_only(tmp_path):
    """outcome="intermittent": passes when the deviation does not show, xfails (with this run's
    observation) when an assertion fails, and an error stays a failure."""
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "conftest.py").write_text(INTERMITTENT_CONFTEST)
    (tmp_path / "test_intermittent.py").write_text(INTERMITTENT_TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTHONPATH"] = root
    proc = warm.run([sys.executable, "-m", "pytest", str(tmp_path), "--rootdir", str(tmp_path), "-rA",
                     "-p", "no:cacheprovider", "--backend", "nccl",  # nccl: no world, no rank processes
                     "--allow-unavailable"],
                    cwd=root, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert "1 failed, 1 passed, 1 xfailed" in out, out[-3000:]
    lines = out.splitlines()  # -rA: "PASSED <path>::<test>", "XFAIL <path>::<test> - <reason>"
    assert any(line.startswith("PASSED") and line.endswith("::test_deviation_absent") for line in lines), out
    # The FAILED line carries " - RuntimeError: boom" when the terminal is wide enough (CI's is).
    assert any(line.startswith("FAILED") and "::test_error_is_never_excused" in line for line in lines), out
    assert any(line.startswith("XFAIL") and line.endswith(
        "::test_deviation_seen - toy agent: shows in some runs; this run: 3 of 8 calls brought their events back")
        for line in lines), out[-3000:]


def test_torch_capability_flags_become_gaps():
    from backends.spec import FEATURES, TORCH_FLAGS, UnknownRequirementKey, gaps_from_flags

    gaps = gaps_from_flags({"supports_coalescing": False, "supports_gather_single": False,
                            "supports_splitting": True}, "declared by the vendor")
    spec = BackendSpec(name="flags", gaps=gaps)
    assert spec.gap_for(feature="coalescing").reason == "supports_coalescing=False: declared by the vendor"
    assert spec.gap_for(collective="gather", form="single") is not None
    assert spec.gap_for(collective="gather") is None and spec.gap_for(feature="splitting") is None
    with pytest.raises(UnknownRequirementKey, match="'supports_teleport'"):
        gaps_from_flags({"supports_teleport": False}, "r")
    # every feature value used by a built-in gap is declared
    used = {g.match["feature"] for spec in BackendRegistry().specs.values() for g in spec.all_gaps
            if "feature" in g.match and isinstance(g.match["feature"], str)}
    assert used <= set(FEATURES), used - set(FEATURES)
    assert all(set(need) <= set(__import__("backends.spec", fromlist=["REQUIREMENT_KEYS"]).REQUIREMENT_KEYS)
               for need in TORCH_FLAGS.values())


NEEDS_TYPO_TESTS = '''
import pytest

@pytest.mark.needs(feature="coalescing", form="devcie")
def test_typo(world):
    pass
'''


def test_a_needs_marker_with_an_unknown_value_stops_collection_naming_it(tmp_path):
    """needs() is read against the same vocabulary as the gaps: a closed key's other value is a usage error."""
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["fixtures.pytest_plugin"]\n')
    (tmp_path / "test_typo.py").write_text(NEEDS_TYPO_TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTHONPATH"] = root
    proc = warm.run([sys.executable, "-m", "pytest", str(tmp_path), "--rootdir", str(tmp_path), "--collect-only",
                     "-p", "no:cacheprovider", "--backend", "nccl", "--world-size", "2",
                     "--allow-unavailable"],
                    cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "test_typo.py::test_typo[nccl-ws2]: needs(): unknown form 'devcie'; known: list, single, device" \
        in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_a_gap_that_breaks_the_backend_or_a_rank_gets_its_world_replaced(tmp_path):
    """consequence="breaks_backend" or "kills_rank": the case runs (a strict xfail) in the world it shares with the
    case before, and the case after gets new rank processes (fresh groups in the old ones would inherit the broken
    state; a rank whose heap the gap corrupted crashes later, in whatever case comes next)."""
    import json
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pids = tmp_path / "pids.jsonl"
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")},
           "DISTCONFORM_TEST_PIDS": str(pids)}
    proc = warm.run([sys.executable, "-m", "pytest", "tests/harness_cases/breaks_backend.py", "--backend",
                     "gloo_breaks,gloo_corrupts", "--backend-plugin", "tests.harness_cases.breaks_backend", "--world-size", "2",
                     "-n", "0", "-q", "-p", "no:cacheprovider", "--report-dir", str(tmp_path / "report")],
                    cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 passed, 2 xfailed" in proc.stdout, proc.stdout[-2000:]
    seen = dict(json.loads(line) for line in pids.read_text().splitlines())
    for world in ("gloo_breaks-ws2", "gloo_corrupts-ws2"):
        assert seen[f"{world}/before"] == seen[f"{world}/breaks"], seen
        assert not set(seen[f"{world}/after"]) & set(seen[f"{world}/breaks"]), seen
