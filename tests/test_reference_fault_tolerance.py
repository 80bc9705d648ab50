"""The reference's reconfigure requests (backends/reference/fault_tolerance.py): every request is either a place in
the new communicator or a RuntimeError naming what is wrong, whatever the handles are."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.reference.fault_tolerance import FaultState, membership

OWN = "reference:own"


def test_a_list_numbers_by_position_and_a_set_in_sorted_order():
    place = membership(1, ["reference:b", OWN, "reference:a"], OWN, set())
    assert (place.rank, place.size) == (1, 3)
    place = membership(2, {"reference:b", OWN, "reference:a"}, OWN, set())
    assert (place.rank, place.size) == (sorted(["reference:b", OWN, "reference:a"]).index(OWN), 3)


@pytest.mark.parametrize("uuid, handles, used, words", [
    (5, [OWN], {5}, "already used"),
    (5, [], set(), "at least one handle"),
    (5, [OWN, OWN], set(), "must be unique"),
    (5, ["reference:other"], set(), "not part of the new communicator"),
])
def test_refusals_name_the_problem(uuid, handles, used, words):
    with pytest.raises(RuntimeError, match=words):
        membership(uuid, handles, OWN, used)


@given(uuid=st.integers(), handles=st.lists(st.sampled_from([OWN, "reference:a", "reference:b", "", "x"]) | st.text()),
       used=st.sets(st.integers(min_value=-3, max_value=3)))
def test_any_request_is_a_place_or_a_named_refusal(uuid, handles, used):
    try:
        place = membership(uuid, handles, OWN, used)
    except RuntimeError as exc:
        assert str(exc).startswith("reference: ")
        return
    assert handles[place.rank] == OWN and place.size == len(handles) and uuid not in used


def test_abort_hooks_run_once_on_the_first_fault_and_not_after_unregister():
    calls: list[int] = []
    state = FaultState()
    state.register_abort_hook(1, lambda: calls.append(1))
    state.register_abort_hook(2, lambda: calls.append(2))
    state.register_abort_hook(3, lambda: 1 / 0)  # a hook's error stops neither the others nor the revoke
    state.unregister_abort_hook(2)
    state.revoked("TIMEOUT")
    state.revoked("REMOTE_ERROR")
    assert calls == [1] and state.error == "TIMEOUT"
