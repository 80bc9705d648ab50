"""The --debug-level axis: parsing, ids, the ranks' TORCH_DISTRIBUTED_DEBUG, gaps that hold at one level only."""

from __future__ import annotations

import pytest

from backends.builtin import BUILTIN_SPECS
from backends.registry import BackendRegistry
from fixtures.pytest_plugin import Target, _parse_debug_levels
from fixtures.world import World
from tests.harness_cases import debug_fns
from tests.harness_cases.procs import run_pytest

DEBUG_CLAUSE = "suites/parallel/test_debug.py"
GLOO = BUILTIN_SPECS["gloo"]
DETAIL, OFF = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, {"TORCH_DISTRIBUTED_DEBUG": "OFF"}


# ----------------------------------------------------------------- parsing
def test_levels_parse_case_insensitively_in_order_without_duplicates(monkeypatch):
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    assert _parse_debug_levels(None) == ["OFF"]
    assert _parse_debug_levels("off, detail,OFF,info") == ["OFF", "DETAIL", "INFO"]


def test_the_default_is_the_environment_so_a_debugging_user_sees_it_recorded(monkeypatch):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    assert _parse_debug_levels(None) == ["DETAIL"]
    assert _parse_debug_levels("OFF") == ["OFF"]  # the option wins


@pytest.mark.parametrize("text", ["VERBOSE", ",", "OFF,2"])
def test_a_bad_level_is_a_usage_error_naming_it(text):
    with pytest.raises(pytest.UsageError, match="--debug-level"):
        _parse_debug_levels(text)


def test_ids_carry_any_level_but_off():
    assert Target("gloo", 2).id == "gloo-ws2"
    assert Target("gloo", 2, debug_level="DETAIL").id == "gloo-ws2-DETAIL"
    assert Target("gloo", 2, debug_level="INFO").rank_env == {"TORCH_DISTRIBUTED_DEBUG": "INFO",
                                                               "DISTCONFORM_INIT": "lazy"}


def test_command_line_collects_one_case_per_level_and_rejects_a_bad_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    run = run_pytest([DEBUG_CLAUSE, "--debug-level", "OFF,DETAIL", "--world-size", "2", "--collect-only", "-q",
                      "-k", "shape_mismatch"], tmp_path / "collect")
    assert run.returncode == 0, run.output
    ids = sorted(line.split("::")[1] for line in run.output.splitlines() if "::" in line)
    assert ids == ["test_detail_reports_shape_mismatch[gloo-ws2-DETAIL]", "test_detail_reports_shape_mismatch[gloo-ws2]"]
    run = run_pytest([DEBUG_CLAUSE, "--debug-level", "LOUD", "--collect-only"], tmp_path / "bad")
    assert run.returncode == 4 and "--debug-level: 'LOUD' is not a TORCH_DISTRIBUTED_DEBUG level" in run.output, \
        run.output


# -------------------------------------------------------------------- gaps
def test_gloos_unchecked_sizes_gap_does_not_hold_under_detail():
    for case in ("all_reduce_mismatched_shapes", "all_reduce_mismatched_dtypes"):
        assert GLOO.gap_for(env=OFF, bad_input=case, collective="all_reduce") is not None
        assert GLOO.gap_for(env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, bad_input=case) is not None
        assert GLOO.gap_for(env=DETAIL, bad_input=case, collective="all_reduce") is None


def test_torch_ddp_on_gloo_is_skipped_under_detail_only():
    gap = GLOO.gap_for(env=DETAIL, feature="ddp", impl="torch")
    assert gap is not None and gap.outcome == "skip" and "SIGSEGV" in gap.reason
    assert GLOO.gap_for(env=OFF, feature="ddp", impl="torch") is None
    assert GLOO.gap_for(env=DETAIL, feature="ddp", impl="reference") is None


# ------------------------------------------------------------------ ranks
@pytest.mark.parametrize("level,backend", [("DETAIL", "_ProcessGroupWrapper"), ("OFF", "ProcessGroupGloo")])
def test_ranks_run_at_the_worlds_level(level, backend, monkeypatch):
    """The fork server imported torch before the level was known: every rank must still run at it."""
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    world = World(BackendRegistry().get("gloo"), 2, ("cpu",) * 2, debug_level=level).start()
    try:
        assert world.name == ("gloo-ws2" if level == "OFF" else f"gloo-ws2-{level}")
        assert world.run(debug_fns.debug_level_and_backend) == [(level, backend)] * 2
    finally:
        world.close()


def test_a_detail_world_is_resynchronised_after_partial_p2p(monkeypatch):
    """Sequence numbers left apart by a case's send/recv must not fail the next case's first collective."""
    from fixtures.debug_level import resync_after_case, sequence_number

    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    world = World(BackendRegistry().get("gloo"), 3, ("cpu",) * 3, debug_level="DETAIL").start()
    try:
        world.run(debug_fns.send_rank0_to_rank1)
        assert world.run(sequence_number) == [1, 1, 0]
        resync_after_case(world)
        assert getattr(world, "resets", 0) == 1
        assert world.run(debug_fns.all_reduce_ranks) == [6.0] * 3
        resync_after_case(world)  # in step now: nothing to do
        assert world.resets == 1
    finally:
        world.close()
