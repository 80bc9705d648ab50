"""Contract: on generated calls every collective agrees with the reference semantics.

hypothesis draws collective calls: the operation (all_reduce, reduce,
broadcast, all_gather into a list or one tensor, gather, scatter,
reduce_scatter from a list or one tensor, all_to_all_single with even or
uneven splits, all_to_all with lists), the reduce op (those meaningful for the
dtype), the dtype, the shape (0-d where the API allows one, 1-D, 2-D, zero
elements; small: at most 24 elements a chunk, size-dependent paths are the
per-collective suites' 4 MiB cases), the layout (contiguous, or every other
element of a larger buffer whose other elements must stay untouched), the
root, and the group (the world, or new_group of a non-empty subset of ranks;
non-members do nothing and keep their tensors). (operation, dtype, op) is one
uniform choice. The backend runs each call in its world (one World.run per
call); the pytest process computes what every rank must hold from
backends/reference/semantics.py, on the same seeded inputs (see
suites/c10d/differential.py). Results must match bitwise (AVG: within 2 ulp),
out-of-place calls must leave their inputs unchanged, and reduce's non-root
tensors are not checked (c10d leaves them unspecified).

Calls that hit one of the backend's declared gaps (the same requirement keys
as the other suites: collective, op, dtype, layout, form, split, shape,
feature="subgroups") are never drawn.

Every run first checks the pinned calls (``pinned_calls``): one per seeded
bug of tests/seeded/ this clause catches, so those are caught on every run,
not by luck of the draw.

Options and reproduction (the runner: suites/differential.py):

* ``--hypothesis-profile ci|thorough|pins``: calls per backend and world
  size, 200 (``ci``, the default), 2000, or the pins alone
  (fixtures/hypothesis_profiles.py).
* ``--hypothesis-seed N``: the same calls every run (hypothesis's own option).
  Without it each run draws new calls; the example database is off.
* A failure shrinks to a minimal call and prints it as ``Call(...)``; rerun
  exactly that call with
  ``DISTCONFORM_REPLAY="Call(...)" python -m pytest suites/c10d/test_differential.py --backend B --world-size N``
  (the failure message spells the command out, with any --backend-plugin). A
  replayed call runs even if it hits a declared gap (the message then says so).
* A call that kills or hangs the world is reported as is, without shrinking
  (each attempt would cost a new world or a full deadline).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from suites import collectives, values
from suites.c10d.differential import (LAYOUTS, SHAPE_CLASSES, Call, expected_of, need_of, operations, ops_for,
                                      run_on_rank, sentinel, splits_of)
from suites.checks import expect_tensor
from suites.differential import REPLAY_ENV, Pin, explore, replayed, run_on_world

# ------------------------------------------------------------ strategy
def allowed_combos(spec, world_size: int) -> list[tuple]:
    """Every (operation, split, dtype, op, shape class, layout, subgroup) the backend claims to support."""
    combos = []
    for operation in operations():  # every collective of suites/collectives.py
        scalar_ok = collectives.get(operation).allows_scalar
        for split in splits_of(operation):
            for dtype in values.DTYPES:
                for op in ops_for(operation, dtype):
                    for shape_cls in SHAPE_CLASSES:
                        if shape_cls == "scalar" and not scalar_ok:
                            continue
                        for layout in LAYOUTS:
                            if layout == "non_contiguous" and shape_cls in ("scalar", "empty"):
                                continue  # no strided view of these
                            for subgroup in (False, True):
                                need = need_of(operation, op, dtype, shape_cls, layout, subgroup, split)
                                if spec.gap_for(**need) is None:
                                    combos.append((operation, split, dtype, op, shape_cls, layout, subgroup))
    return combos


FLAT_LEVELS = 4  # (operation, split, dtype, op): drawn as one choice


def combo_tree(combos: list[tuple]) -> tuple[list, dict]:
    """The combinations as (the distinct (operation, split, dtype, op) prefixes, nested dicts of the rest)."""
    prefixes = list(dict.fromkeys(c[:FLAT_LEVELS] for c in combos))
    tree: dict = {}
    for combo in combos:
        node = tree.setdefault(combo[:FLAT_LEVELS], {})
        for value in combo[FLAT_LEVELS:]:
            node = node.setdefault(value, {})
    return prefixes, tree


def _draw_combo(draw, prefixes_and_tree: tuple[list, dict]) -> tuple:
    """One allowed combination.

    (operation, split, dtype, op) is one uniform choice, so a bug in one
    reduce op of one dtype is as likely to be hit as a bug in broadcast of
    one dtype; then shape class, layout and subgroup a field at a time. Each
    choice shrinks towards its first value (all_reduce float32 sum, 1-D,
    contiguous, the world).
    """
    prefixes, tree = prefixes_and_tree
    chosen = draw(st.sampled_from(prefixes))
    node = tree[chosen]
    while node:
        value = draw(st.sampled_from(list(node)))
        chosen += (value,)
        node = node[value]
    return chosen


def _shape(draw, shape_cls: str, layout: str) -> tuple:
    wide = 2 if layout == "non_contiguous" else 1  # a strided view needs 2+ elements in its last dim
    if shape_cls == "scalar":
        return ()
    if shape_cls == "1d":
        return (draw(st.integers(wide, 6)),)
    if shape_cls == "2d":
        return (draw(st.integers(1, 4)), draw(st.integers(wide, 4)))
    return draw(st.sampled_from([(0,), (0, 3), (2, 0)]))


MAX_ALL_SUBSETS_WORLD = 5  # beyond this, a fixed family of subsets: new_group costs a rendezvous each


def subsets(world_size: int) -> list[tuple]:
    """The subgroups drawn from, largest first: every non-empty subset of the ranks in small
    worlds; in larger ones the whole world, all but one rank, single ranks, halves, odd and even ranks."""
    ranks = range(world_size)
    if world_size <= MAX_ALL_SUBSETS_WORLD:
        family = {tuple(r for r in ranks if mask >> r & 1) for mask in range(1, 2**world_size)}
    else:
        half = world_size // 2
        family = {tuple(ranks), tuple(ranks[:half]), tuple(ranks[half:]), tuple(ranks[0::2]), tuple(ranks[1::2])}
        family |= {tuple(r for r in ranks if r != left_out) for left_out in ranks}
        family |= {(r,) for r in ranks}
    return sorted(family, key=lambda group: (-len(group), group))


@st.composite
def calls(draw, tree: tuple[list, dict], world_size: int, backend: str) -> Call:
    operation, split, dtype, op, shape_cls, layout, subgroup = _draw_combo(draw, tree)
    group = None
    if subgroup:
        # every non-empty subset equally likely; shrinks towards the whole world as a new group
        group = draw(st.sampled_from(subsets(world_size)))
    members = tuple(range(world_size)) if group is None else group
    root = draw(st.sampled_from(members)) if collectives.get(operation).rooted else None
    splits = None
    if split == "uneven":
        n = len(members)
        # rows from group rank i to group rank j; a 2-D "empty" moves rows of zero elements
        if shape_cls == "2d":
            rest = (draw(st.integers(2 if layout == "non_contiguous" else 1, 3)),)
        elif shape_cls == "empty":
            rest = draw(st.sampled_from([(), (0,)]))
        else:
            rest = ()
        if shape_cls == "empty" and rest == ():
            splits = tuple((0,) * n for _ in range(n))
        else:
            row = st.lists(st.integers(0, 3), min_size=n, max_size=n).map(tuple)
            splits = draw(st.lists(row, min_size=n, max_size=n).map(tuple)
                          .filter(lambda m: shape_cls == "empty" or any(map(any, m))))
        shape = (0,) + rest
    else:
        shape = _shape(draw, shape_cls, layout)
    seed = draw(st.integers(0, 2**32 - 1))
    call = Call(operation=operation, op=op, dtype=dtype, shape=shape, layout=layout, root=root, group=group,
                splits=splits, seed=seed, world_size=world_size, backend=backend)
    assert call.shape_class == shape_cls, (call, shape_cls)
    return call


# ------------------------------------------------------------ one call
def check_call(world, call: Call, note: str = "") -> None:
    """Run ``call`` in ``world`` and compare every rank's tensors with the oracle's."""
    __tracebackhide__ = True  # the failure is the message (with the call), not this function's lines
    where = f"\nfailing call: {call!r}\nreplay: {call.replay_command(world.plugins)}{note}"
    results = run_on_world(world, where, run_on_rank, call)
    expected = expected_of(call)
    try:
        for rank, (got, want) in enumerate(zip(results, expected.per_rank)):
            assert len(got["tensors"]) == len(want), \
                f"rank {rank} returned {len(got['tensors'])} tensors, expected {len(want)}"
            for (what, tensor), actual in zip(want, got["tensors"]):
                if tensor is not None:
                    expect_tensor(actual, tensor, f"{call.operation} {what} on rank {rank}",
                                  exact=expected.exact or "unchanged" in what)
            for k, outside in enumerate(got["outside"]):
                expect_tensor(outside, torch.full_like(outside, sentinel(call.dtype)),
                              f"{call.operation}: buffer elements outside strided view {k} on rank {rank}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}{where}") from None


# ------------------------------------------------------------ pins
def pinned_calls(world_size: int, backend: str) -> list[Pin]:
    """The calls the seeded bugs of tests/seeded/ need, each run before any drawn one (those outside the
    backend's declared gaps: the clause drops the rest), with the bugs each catches."""
    n, last = world_size, world_size - 1
    # asymmetric uneven splits: rank i sends (i + 2j + 1) % 4 rows to rank j, receives (j + 2i + 1) % 4 from it
    uneven = tuple(tuple((i + 2 * j + 1) % 4 for j in range(n)) for i in range(n))

    def pin(catches: tuple[str, ...], operation: str, op: str | None, dtype: str = "float32", shape: tuple = (4,),
            **fields) -> Pin:
        return Pin(Call(operation=operation, op=op, dtype=dtype, shape=shape, seed=1, world_size=n, backend=backend,
                        **fields), catches)

    pins = [
        pin(("allreduce_misses_last_rank", "native_skip_last_rank"), "all_reduce", "sum"),
        pin(("avg_as_sum",), "all_reduce", "avg"),
        pin(("reduce_op_ignored", "reference_wrong_reduce_op"), "all_reduce", "max", "int32"),
        pin(("int64_through_float64",), "all_reduce", "sum", "int64"),
        pin(("subgroup_avg_by_world_size",), "all_reduce", "avg", group=tuple(range(max(1, last)))),
        pin(("reduce_to_rank_zero",), "reduce", "sum", root=last),
        pin(("broadcast_wrong_root", "uint8_saturates_at_127"), "broadcast", None, "uint8", (8,), root=last),
        pin(("all_gather_wrong_order", "reference_lost_chunk"), "all_gather", None),
        pin(("non_contiguous_lost",), "all_gather", None, layout="non_contiguous"),
        pin(("allgather_base_reversed",), "all_gather_into_tensor", None),
        pin(("gather_list_reversed",), "gather", None, root=last),
        pin(("scatter_ignores_root_order",), "scatter", None, root=last),
        pin(("reduce_scatter_wrong_chunk",), "reduce_scatter_tensor", "sum"),
        pin(("reduce_scatter_base_avg_as_sum",), "reduce_scatter_tensor", "avg"),
        pin(("all_to_all_splits_ignored", "all_to_all_splits_swapped"), "all_to_all_single", None, shape=(0,),
            splits=uneven),
    ]
    if n >= 3:  # a subgroup without rank 0, rooted at its last member: the smallest world that shows it
        pins.append(pin(("subgroup_root_translated_twice",), "broadcast", None, root=last, group=tuple(range(1, n))))
    return pins


# ------------------------------------------------------------------ clause
def test_differential(world, backend_spec):
    """Generated collective calls (op, dtype, shape, layout, root, subgroup) match the reference semantics."""
    call = replayed(Call)
    if call is not None:
        if (call.backend, call.world_size) != (backend_spec.name, world.world_size):
            pytest.skip(f"{REPLAY_ENV} replays a call for {call.backend} at world size {call.world_size}")
        gap = backend_spec.gap_for(**call.need())
        check_call(world, call, f"\n(the call hits a declared gap of {call.backend}: {gap.reason})" if gap else "")
        return
    combos = allowed_combos(backend_spec, world.world_size)
    if not combos:
        pytest.skip(f"{backend_spec.name}: every generated call would hit a declared gap")
    pins = [pin for pin in pinned_calls(world.world_size, backend_spec.name)
            if backend_spec.gap_for(**pin.example.need()) is None]
    explore(calls(combo_tree(combos), world.world_size, backend_spec.name), lambda call: check_call(world, call), pins)
