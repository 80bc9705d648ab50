"""The seeded-bug gallery's machinery: bugs planted per backend, runs shared, each backend narrowed to its bug's cases.

tests/test_seeded_bugs.py runs the gallery; these check, in this process and
in milliseconds, what makes sharing a run safe: a bug planted with
tests/seeded/planting.py is live in its own backend's ranks only, a module
that patches shared code otherwise is kept alone, and the plan a run's
plugin (tests/gallery_plugin.py) reads is refused with the problem named.
"""

from __future__ import annotations

import ast
import json
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.rank import ctx
from tests.gallery_plugin import Selection, read_plan
from tests.seeded.planting import plant, planted_in
from tests.test_seeded_bugs import (BATCHES, BUGS_PER_RUN, batches, control_suites, gallery, read_bug, shares_a_run,
                                    split_extra_args, suites_of)


@pytest.fixture
def backend_of_this_process():
    saved = ctx.backend
    yield
    ctx.backend = saved


def test_a_planted_bug_is_live_only_in_its_backends_ranks(backend_of_this_process):
    """Two bugs on one function: each backend's ranks run their own, every other process the original."""
    owner = types.ModuleType("shared_code")
    owner.double = lambda x: 2 * x
    plant("bug_a", owner, "double", lambda original: lambda x: original(x) + 1)
    plant("bug_b", owner, "double", lambda original: lambda x: original(x) - 1)
    seen = {}
    for backend in ("", "gloo", "bug_a", "bug_b"):
        ctx.backend = backend
        seen[backend] = owner.double(10)
    assert seen == {"": 20, "gloo": 20, "bug_a": 21, "bug_b": 19}
    assert planted_in(owner, "double") == ("bug_a", "bug_b")


def test_planting_a_missing_attribute_names_the_module_to_update():
    """A refactored core: the bug module is told which attribute is gone, not an AttributeError from deep inside."""
    with pytest.raises(ImportError, match=r"bug_a: shared_code has no attribute 'gone' any more.*tests/seeded/bug_a.py"):
        plant("bug_a", types.ModuleType("shared_code"), "gone", lambda original: original)


@pytest.mark.parametrize("source, shares", [
    ("from tests.seeded.planting import plant\nplant('x', M, 'f', g)\nDISTCONFORM_SPEC = register('x', C)", True),
    ("import threading\n_LOCK = threading.Lock()\nDISTCONFORM_SPEC = register_reference('x', C)", True),
    ("DISTCONFORM_SPEC = spec('x', __doc__.strip().splitlines()[0])", True),
    ("Reducer.mark_unused_parameters_ready = nothing\nDISTCONFORM_SPEC = register('x', C)", False),
    ("serialize.register_reducer(P, R)\nDISTCONFORM_SPEC = register('x', C)", False),
    ("DISTCONFORM_SPEC = register('x', make_class())", False),
    ("if True:\n    X = 1", False),
    ("from tests.seeded.rpc_parameter_as_tensor import DISTCONFORM_SPEC", False),
])
def test_only_modules_that_keep_their_bug_to_their_backend_share_a_run(source, shares):
    """Planting through planting.py, locks and registering share; an attribute set on shared code keeps a bug alone."""
    assert shares_a_run(ast.parse(source)) is shares


def test_every_bug_shares_a_run_but_those_that_patch_shared_code():
    """The gallery's actual alone list: each patches code every backend runs (a pickler, a harness function)."""
    alone = sorted(module for module in gallery() if not read_bug(module).shares_a_run)
    assert alone == ["dist_optimizer_stale_gradients", "rpc_device_map_dropped", "rpc_parameter_as_tensor"], alone


def test_runs_hold_every_bug_once_with_one_set_of_run_options():
    """Every bug in exactly one run, at most BUGS_PER_RUN to a run, and a run's bugs agree on options and deadline."""
    modules = [module for run in BATCHES for module in run]
    assert sorted(modules) == gallery()
    for run in BATCHES:
        bugs = [read_bug(module) for module in run]
        assert len(run) <= BUGS_PER_RUN
        assert len({(bug.options, bug.hangs) for bug in bugs}) == 1, run
        assert len(run) == 1 or all(bug.shares_a_run for bug in bugs), run
    assert len(BATCHES) < len(modules) / 3  # the point: far fewer pytest starts than bugs


def test_batches_split_a_large_group_evenly():
    """Twenty sharable bugs of one kind: three runs of 7, 7 and 6, not 8, 8 and 4."""
    same_kind = [module for module in gallery() if read_bug(module).shares_a_run
                 and not read_bug(module).options and not read_bug(module).hangs][:20]
    assert sorted(len(run) for run in batches(same_kind)) == [6, 7, 7]


def test_extra_args_split_into_run_options_and_the_bugs_keyword():
    """--rpc-agent/--world-size/--debug-level are the run's; -k is the bug's own; anything else is refused, named."""
    assert split_extra_args("m", ("--rpc-agent", "reference-tp", "-k", "strides", "--world-size", "3")) == (
        ("--rpc-agent", "reference-tp", "--world-size", "3"), "strides")
    with pytest.raises(ValueError, match=r"tests/seeded/m.py: EXTRA_ARGS.*--deadline"):
        split_extra_args("m", ("--deadline", "3"))
    with pytest.raises(ValueError, match="each with a value"):
        split_extra_args("m", ("-k",))


def test_a_run_collects_each_path_once():
    """A file and a clause inside it, a folder and a file inside it: pytest is given the outer one only."""
    def bug(suite):
        return types.SimpleNamespace(suite=suite)

    assert suites_of([bug("suites/c10d/test_timeouts.py::test_x"), bug("suites/c10d/test_timeouts.py"),
                      bug("suites/ddp/test_join.py"), bug("suites/ddp/"), bug("suites/rpc/test_calls.py")]) == (
        "suites/c10d/test_timeouts.py", "suites/ddp/", "suites/rpc/test_calls.py")


@pytest.mark.parametrize("suite, keyword, nodeid, selected", [
    ("suites/ddp/", "", "suites/ddp/test_join.py::test_join[b-ws2]", True),
    ("suites/ddp/", "", "suites/ddp_more/test_x.py::test_x[b-ws2]", False),
    ("suites/c10d/test_x.py", "", "suites/c10d/test_x.py::test_y[b-ws2]", True),
    ("suites/c10d/test_x.py", "", "suites/c10d/test_x_more.py::test_y[b-ws2]", False),
    ("suites/c10d/test_x.py::test_y", "", "suites/c10d/test_x.py::test_y[b-ws2]", True),
    ("suites/c10d/test_x.py::test_y", "", "suites/c10d/test_x.py::test_y_more[b-ws2]", False),
    ("suites/c10d/test_x.py", "Merge", "suites/c10d/test_x.py::test_merge_group[b-ws2]", True),
    ("suites/c10d/test_x.py", "merge", "suites/c10d/test_x.py::test_shrink[b-ws2]", False),
])
def test_a_backend_runs_only_its_bugs_cases(suite, keyword, nodeid, selected):
    """The folder, file or clause a bug names, and its -k word (any case) in the case's name."""
    assert Selection(suite, keyword).selects(nodeid, nodeid.split("::")[-1]) is selected


def test_a_good_plan_is_read(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"bug_a": {"suite": "suites/ddp/"}, "bug_b": {"suite": "suites/x.py", "keyword": "k_1"}}))
    assert read_plan(str(path)) == {"bug_a": Selection("suites/ddp/"), "bug_b": Selection("suites/x.py", "k_1")}


@given(st.binary(max_size=200))
def test_any_plan_file_is_read_or_refused_with_the_problem_named(tmp_path_factory, content):
    """Whatever the plan file holds: a plan, or a usage error naming the file, never a traceback from inside."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_bytes(content)
    try:
        plan = read_plan(str(path))
    except pytest.UsageError as exc:
        assert str(path) in str(exc)
    else:
        assert all(isinstance(selection, Selection) for selection in plan.values())


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8))
def test_any_json_plan_is_read_or_refused_with_the_problem_named(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(json.dumps(document))
    try:
        plan = read_plan(str(path))
    except pytest.UsageError as exc:
        assert str(path) in str(exc)
    else:
        assert all(isinstance(s.suite, str) and isinstance(s.keyword, str) for s in plan.values())


def test_the_control_covers_every_area_and_the_rpc_files_bugs_run_over_the_backend():
    """Every non-RPC area whole; of the RPC areas, the files a bug runs on an agent whose messages cross the backend."""
    suites = control_suites()
    assert {"suites/c10d/", "suites/p2p/", "suites/ddp/", "suites/parallel/", "suites/soak/"} <= set(suites)
    assert "suites/rpc/test_futures.py" in suites  # rpc_pg_callback_blocks_listener, on reference-pg
    assert not any(path.startswith(("suites/rpc/", "suites/dist_autograd/", "suites/profiling/"))
                   for path in suites if path != "suites/rpc/test_futures.py")
