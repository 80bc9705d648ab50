"""backends/spec.py and backends/registry.py: capability gaps and backend lookup."""

import pytest
import torch
import torch.distributed as dist

from backends.builtin import BUILTIN_SPECS
from backends.registry import BackendRegistry, PluginImportError, UnknownBackend, load_plugin
from backends.spec import Availability, BackendSpec, Gap


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
