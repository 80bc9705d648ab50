"""The differential runner (suites/differential.py) and its budgets (fixtures/hypothesis_profiles.py), without a world.

``DISTCONFORM_REPLAY`` comes from the environment, so its parser is fuzzed:
whatever the text, it returns the example or raises one of its two errors.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.hypothesis_profiles import BUDGETS, CI, THOROUGH
from backends.spec import check_requirement_keys
from suites.c10d import differential as c10d
from suites.c10d.differential import Call
from suites.c10d.test_differential import pinned_calls
from suites.ddp import differential as ddp
from suites.ddp.differential import Case
from suites.ddp.test_differential import RUN_COST, pinned_cases
from tests.seeded.registry import BUGS
from suites.differential import REPLAY_ENV, BadReplay, OtherExample, budget, parse_example, replayed

CALL = Call(operation="all_to_all_single", op=None, dtype="int64", shape=(0, 2), layout="non_contiguous",
            group=(0, 2), splits=((1, 0), (2, 3)), seed=7, world_size=3, backend="gloo")
CASE = Case(widths=(2, 3, 1), rows=(1, 4), iterations=(2, 1), loss="sum", divide_by_initial_world_size=False,
            mode="find_unused", seed=5)


@pytest.mark.parametrize("example", [CALL, CASE], ids=["Call", "Case"])
def test_a_repr_parses_back_to_its_example(example):
    assert parse_example(repr(example), type(example)) == example


def test_another_clauses_example_is_told_apart():
    with pytest.raises(OtherExample) as caught:
        parse_example(repr(CASE), Call)
    assert caught.value.args == ("Case",)


@pytest.mark.parametrize("text, problem", [
    ("Call(operation='all_reduce'", "not a Python expression"),
    ("__import__('os').system('true')", "must be an example's repr"),
    ("Call('all_reduce')", "takes its fields by name"),
    ("Call(operation=str(1), op=None, dtype='float32', shape=(1,))", "field 'operation' of Call is not a literal"),
    ("Call(operation='all_reduce', colour='red')", "unexpected keyword argument 'colour'"),
    ("Call(operation='all_reduce', op=3, dtype='float32', shape=(1,))", "field 'op' of Call must be str | None, not int"),
    ("Call(operation='all_reduce', op=None, dtype='float32', shape=[1])", "field 'shape' of Call must be tuple, not list"),
    ("Call(operation={[1]: 2})", "field 'operation' of Call is not a literal"),
    ("Call(operation=\x00)", "not a Python expression"),
])
def test_a_bad_replay_names_its_problem(text, problem):
    with pytest.raises(BadReplay, match=problem):
        parse_example(text, Call)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80),
                 st.builds(lambda fields: f"Case({fields})", st.text(max_size=60)),
                 st.builds(repr, st.builds(Case, widths=st.tuples(st.integers(1, 6)), rows=st.tuples(st.integers(1, 4)),
                                           iterations=st.tuples(st.integers(1, 4))))))
def test_any_replay_text_gives_the_example_or_a_named_error(text):
    try:
        parsed = parse_example(text, Case)
    except (BadReplay, OtherExample):
        return
    assert isinstance(parsed, Case)


def test_replayed_skips_for_another_clause_and_fails_on_garbage(monkeypatch):
    monkeypatch.delenv(REPLAY_ENV, raising=False)
    assert replayed(Call) is None
    monkeypatch.setenv(REPLAY_ENV, repr(CALL))
    assert replayed(Call) == CALL
    with pytest.raises(pytest.skip.Exception, match="replays a Call, another clause's example, not a Case"):
        replayed(Case)
    monkeypatch.setenv(REPLAY_ENV, "Call(")
    with pytest.raises(pytest.fail.Exception, match="DISTCONFORM_REPLAY is not a Python expression"):
        replayed(Call)


@pytest.mark.parametrize("profile, calls, ddp_runs", [(CI, 200, 12), (THOROUGH, 2000, 125)])
def test_the_profiles_budgets(profile, calls, ddp_runs):
    """ci keeps the budgets of the options it replaced (200 calls, 12 DDP runs); the DDP clause draws a run per
    RUN_COST examples."""
    assert BUDGETS[profile] == calls
    current = settings.get_current_profile_name()
    settings.load_profile(profile)
    try:
        assert budget() == calls
        assert budget(Fraction(1, RUN_COST)) == ddp_runs
    finally:
        settings.load_profile(current)


def test_ci_is_the_profile_a_run_starts_with(request):
    chosen = request.config.getoption("--hypothesis-profile")
    assert settings.get_current_profile_name() == (chosen or CI)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_pin_is_a_valid_example_naming_seeded_bugs(world_size):
    """A pin names bugs of tests/seeded/registry.py and is an example the oracle can judge (its expectation computes).

    That each catches its bugs is checked by running the clause on them with a profile of explicit examples
    only (docs/contract.md, differential testing)."""
    known = {bug.name for bug in BUGS}
    pins = pinned_calls(world_size, "gloo") + pinned_cases(world_size, (True, False))
    for pin in pins:
        assert pin.catches and set(pin.catches) <= known, pin
    for pin in pinned_calls(world_size, "gloo"):
        check_requirement_keys(pin.example.need(), f"pin {pin.example!r}")
        assert len(c10d.expected_of(pin.example).per_rank) == world_size
    for pin in pinned_cases(world_size, (True, False)):
        assert pin.example.world_size == world_size
        ddp.expected_of(pin.example)
    caught = [bug for pin in pins for bug in pin.catches]
    assert len(caught) == len(set(caught)), "a bug pinned twice"
