"""The seeded-bug gallery's machinery: bugs declared and planted per backend, runs shared, verdicts that ask where.

tests/test_seeded_bugs.py runs the gallery; these check, in this process and
in milliseconds, what makes sharing a run safe: a bug planted with
tests/seeded/planting.py is live in its own backend's ranks only, a bug
declared not to share runs alone, and the plan a run's plugin
(tests/gallery_plugin.py) reads is refused with the problem named; and what
a verdict counts: a failure of a clause the record names, never the bug
module's own crash (one small gallery run of tests/harness_cases' bugs shows
both, and a catch by a clause the record does not name).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.rank import ctx
from tests.gallery_failures import (FailedCase, NotAFailuresFile, Raised, case_from_dict, chain_from_text,
                                    read_failures, write_failures)
from tests.gallery_plugin import Selection, read_plan
from tests.gallery_record import SeededBug
from tests.gallery_verdict import CAUGHT, CRASHED, WRONG_CLAUSE, judge
from tests.seeded.planting import plant, planted_in
from tests.test_seeded_bugs import (BATCHES, BUGS_PER_RUN, SEEDED_DIR, batches, bug_modules, control_suites, gallery,
                                    read_bug, run_bugs, suites_of)


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


def test_every_bug_shares_a_run_but_those_that_patch_shared_code():
    """The declared alone list: each patches code every backend runs (a pickler, a harness function)."""
    alone = sorted(module for module in gallery() if not read_bug(module).shares_a_run)
    # dcdev_*, rpc_device_map_ignored and rpc_unmapped_device_to_host: importing one registers the dcdev device in every process of the run
    # (torch.accelerator then reports it to every backend's ranks), and dcdev_rank_on_device_zero replaces
    # fixtures.devices.bind_rank_to_device
    assert alone == ["dcdev_early_completion", "dcdev_host_reads_device", "dcdev_rank_on_device_zero",
                     "dist_optimizer_stale_gradients", "rpc_device_map_dropped", "rpc_device_map_ignored",
                     "rpc_parameter_as_tensor", "rpc_unmapped_device_to_host"], alone


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


def json_documents(keys: st.SearchStrategy, max_size: int, max_leaves: int) -> st.SearchStrategy:
    """Any JSON document whose objects take their keys from ``keys``: what a file the gallery reads may hold."""
    return st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=max_size),
                        max_leaves=max_leaves)


@given(json_documents(st.text(max_size=8), max_size=3, max_leaves=8))
def test_any_json_plan_is_read_or_refused_with_the_problem_named(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(json.dumps(document))
    try:
        plan = read_plan(str(path))
    except pytest.UsageError as exc:
        assert str(path) in str(exc)
    else:
        assert all(isinstance(s.suite, str) and isinstance(s.keyword, str) for s in plan.values())


def test_the_control_covers_what_the_wrapper_bugs_run_and_no_more():
    """The suites of the bugs planted in the gloo wrapper; of the RPC areas, their files run over the backend."""
    suites = control_suites()
    assert {"suites/c10d/test_all_reduce.py", "suites/ddp/", "suites/faults/test_network_faults.py",
            "suites/parallel/test_fsdp.py", "suites/p2p/test_send_recv.py"} <= set(suites)
    assert "suites/rpc/test_futures.py" in suites  # rpc_pg_callback_blocks_listener, on reference-pg
    # only the reference's bugs run there: the wrapper's verdicts say nothing about them
    assert not {"suites/c10d/", "suites/c10d/test_lifecycle.py", "suites/soak/"} & set(suites)
    assert not any(path.startswith(("suites/rpc/", "suites/dist_autograd/", "suites/profiling/"))
                   for path in suites if path != "suites/rpc/test_futures.py")


def _imported_bug_modules(name: str) -> set[str]:
    with open(os.path.join(SEEDED_DIR, f"{name}.py")) as fh:
        return set(re.findall(r"tests\.seeded\.(\w+)", fh.read())) - {name}


def test_a_record_says_whether_its_bug_wraps_gloo_as_its_module_does():
    """``wraps_gloo`` is True exactly for the bugs whose module builds on tests/seeded/gloo_wrapper.py."""
    def wraps(name: str, seen: frozenset = frozenset()) -> bool:
        return name == "gloo_wrapper" or any(wraps(other, seen | {name}) for other in
                                             _imported_bug_modules(name) - seen)

    wrong = [module for module in gallery() if read_bug(module).wraps_gloo != wraps(module)]
    assert not wrong, f"tests/seeded/registry.py: wraps_gloo disagrees with the module's imports for {wrong}"


def test_a_record_names_the_cpp_builds_its_module_plants_into():
    """``builds`` names exactly the extensions the module reaches through tests/seeded/native_base.py (native) or
    dcdev_base.py (native and dcdev): the gallery finishes those builds before the bug's run starts its clock."""
    bases = {"native_base": {"native"}, "dcdev_base": {"native", "dcdev"}}

    def builds(name: str, seen: frozenset = frozenset()) -> set[str]:
        found = set(bases.get(name, ()))
        for other in _imported_bug_modules(name) - seen:
            found |= builds(other, seen | {name})
        return found

    wrong = {module: (read_bug(module).builds, sorted(builds(module))) for module in gallery()
             if set(read_bug(module).builds) != builds(module)}
    assert not wrong, f"tests/seeded/registry.py: builds disagrees with the module's imports (record, imports): {wrong}"
    assert sum(1 for module in gallery() if read_bug(module).builds) >= 16  # the native and dcdev bugs


def test_every_bug_module_has_one_record_and_every_record_a_module():
    """A bug module added without its SeededBug (or a record whose module is gone) is named here."""
    assert gallery() == bug_modules(), (
        f"modules without a record in tests/seeded/registry.py: {sorted(set(bug_modules()) - set(gallery()))}; "
        f"records without a module: {sorted(set(gallery()) - set(bug_modules()))}")
    for module in gallery():
        bug = read_bug(module)
        assert os.path.exists(bug.path) and all(bug.collects(clause) for clause in bug.clauses), bug


@pytest.mark.parametrize("changes, problem", [
    ({"clauses": ()}, "names no clause"),
    ({"clauses": ("suites/c10d/test_x",)}, "without parameters"),
    ({"clauses": ("suites/c10d/test_x.py::test_y[gloo-ws2]",)}, "without parameters"),
    ({"clauses": ("suites/c10d/test_other.py::test_y",)}, "outside its suite"),
    ({"options": ("--deadline", "3")}, "must be pairs of --rpc-agent"),
    ({"options": ("--rpc-agent",)}, "must be pairs"),
    ({"keyword": "a or b"}, "one word"),
    ({"needs": ("tpu",)}, "need 'tpu'"),
    ({"builds": ("cuda",)}, "build 'cuda' is none of"),
    ({"suite": "tests/x.py"}, "under suites/"),
])
def test_a_mistyped_record_is_refused_naming_the_bug(changes, problem):
    fields = dict(name="bug_a", contract="c", clauses=("suites/c10d/test_x.py::test_y",), suite="suites/c10d/test_x.py",
                  shares_a_run=True)
    with pytest.raises(ValueError, match=f"seeded bug 'bug_a'.*{problem}"):
        SeededBug(**{**fields, **changes})


BUG = SeededBug(name="bug_a", contract="all_reduce AVG is the mean", suite="suites/c10d/test_all_reduce.py",
                clauses=("suites/c10d/test_all_reduce.py::test_all_reduce",), shares_a_run=True)
CLAUSE_CASE = "suites/c10d/test_all_reduce.py::test_all_reduce[bug_a-ws2-float32-avg]"
OTHER_CASE = "suites/c10d/test_all_reduce.py::test_all_reduce_async[bug_a-ws2-float32-avg]"
CHECK = Raised("AssertionError", "ranks disagree", ("/repo/suites/c10d/test_all_reduce.py", "/repo/suites/checks.py"))


def _failed(nodeid: str) -> list[dict]:
    return [{"nodeid": nodeid, "backend": "bug_a", "outcome": "failed"}, {"nodeid": "x", "backend": "bug_a",
                                                                          "outcome": "skipped"}]


def test_a_failure_of_a_named_clause_counts():
    verdict = judge(BUG, _failed(CLAUSE_CASE), [FailedCase(CLAUSE_CASE, "bug_a", "call", (CHECK,))])
    assert (verdict.kind, verdict.ok) == (CAUGHT, True)


def test_a_failure_of_a_clause_not_named_is_the_wrong_clause():
    verdict = judge(BUG, _failed(OTHER_CASE), [FailedCase(OTHER_CASE, "bug_a", "call", (CHECK,))])
    assert verdict.kind == WRONG_CLAUSE and not verdict.ok
    assert OTHER_CASE in verdict.detail and "suites/c10d/test_all_reduce.py::test_all_reduce" in verdict.detail


@pytest.mark.parametrize("failure", [
    # raised in the bug's patched code, in a rank, relayed to the clause
    FailedCase(CLAUSE_CASE, "bug_a", "call", (Raised("fixtures.errors.RankError", "raised on ranks", ("/r/fixtures/world.py",)),),
               ((Raised("TypeError", "x", ("/r/suites/c10d/test_all_reduce.py", "/r/tests/seeded/bug_a.py")),),)),
    # a call into the bug's override with arguments it does not take: no frame of it, its function named
    FailedCase(CLAUSE_CASE, "bug_a", "call", (Raised("TypeError", "Bug._submit() takes 4 positional arguments but 7 "
                                                    "were given", ("/r/backends/reference/pg.py",),
                                                    "/r/tests/seeded/bug_a.py"),)),
    # the cause of what the clause saw
    FailedCase(CLAUSE_CASE, "bug_a", "call", (Raised("KeyError", "k", ("/r/tests/seeded/bug_a.py",)), CHECK)),
    FailedCase("tests.seeded.bug_a", "bug_a", "import", (Raised("NameError", "x", ("<string>", "/r/tests/seeded/bug_a.py")),)),
])
def test_an_exception_from_the_bugs_own_module_is_a_crash_even_in_a_named_clause(failure):
    verdict = judge(BUG, _failed(CLAUSE_CASE), [failure])
    assert verdict.kind == CRASHED and not verdict.ok
    assert "tests/seeded/bug_a.py" in verdict.text() and "crashed, not caught" in verdict.text()


def test_a_relayed_rank_traceback_is_read_exception_by_exception():
    """The text a rank sends (traceback.format_exception): each exception of the chain with its files."""
    try:
        try:
            {}["k"]
        except KeyError as exc:
            raise RuntimeError("wrapped\nsecond line") from exc
    except RuntimeError as exc:
        import traceback
        chain = chain_from_text("".join(traceback.format_exception(exc)))
    assert [(r.exc_type, r.message) for r in chain] == [("KeyError", "'k'"), ("RuntimeError", "wrapped")]
    assert all(r.origins == (__file__,) for r in chain)


def test_failures_round_trip_through_their_file(tmp_path):
    cases = [FailedCase(CLAUSE_CASE, "bug_a", "call", (CHECK,), ((CHECK, Raised("E", "", (), "/x.py")),))]
    write_failures(str(tmp_path / "f.json"), cases)
    assert read_failures(str(tmp_path / "f.json")) == cases
    assert read_failures(str(tmp_path / "none.json")) == []  # nothing failed, nothing written


@given(json_documents(st.sampled_from(["nodeid", "backend", "when", "raised", "ranks", "exc_type", "message",
                                       "frames", "callee", "other"]), max_size=5, max_leaves=12))
def test_any_failures_file_is_read_or_refused_with_the_problem_named(tmp_path_factory, document):
    """Whatever a failures file holds: failed cases of the declared shape, or NotAFailuresFile naming the file."""
    path = tmp_path_factory.mktemp("failures") / "failures.json"
    path.write_text(json.dumps(document))
    try:
        cases = read_failures(str(path))
    except NotAFailuresFile as exc:
        assert str(path) in str(exc)
    else:
        for case in cases:
            assert case == case_from_dict(case.to_dict())
            assert all(isinstance(o, str) for chain in (case.raised, *case.ranks) for r in chain for o in r.origins)


@given(st.text(max_size=300))
def test_any_traceback_text_reads_as_exceptions_or_none(text):
    assert all(isinstance(r.exc_type, str) and isinstance(r.frames, tuple) for r in chain_from_text(text))


def _harness_bug(name: str) -> SeededBug:
    return SeededBug(name=name, contract="all_reduce AVG is the mean over ranks",
                     clauses=("suites/c10d/test_all_reduce.py::test_all_reduce",),
                     suite="suites/c10d/test_all_reduce.py::test_all_reduce", keyword="avg", shares_a_run=True,
                     package="tests.harness_cases")


def test_a_gallery_run_tells_a_crash_from_a_catch_and_from_the_wrong_clause(tmp_path):
    """One real gallery run of two bugs on the all_reduce clause: the one whose patched code raises a TypeError
    fails that clause too, and is reported crashed, not caught; AVG summed is caught by the clause its record
    names, and the same failure judged against a record naming another clause is the wrong clause."""
    crashes, avg_as_sum = _harness_bug("gallery_crashes"), _harness_bug("gallery_avg_as_sum")
    document, _, failures = run_bugs(tmp_path, (crashes, avg_as_sum))

    crashed = judge(crashes, document["cases"], failures)
    assert crashed.kind == CRASHED, crashed.text()
    assert "TypeError" in crashed.detail and "tests/harness_cases/gallery_crashes.py" in crashed.detail
    assert judge(avg_as_sum, document["cases"], failures).kind == CAUGHT
    elsewhere = dataclasses.replace(avg_as_sum, clauses=("suites/c10d/test_all_reduce.py::test_all_reduce_async",),
                                    suite="suites/c10d/test_all_reduce.py")
    assert judge(elsewhere, document["cases"], failures).kind == WRONG_CLAUSE


def test_a_backend_stops_at_a_named_clause_and_runs_on_past_another():
    """Per-backend -x stops at a failure of a clause the record names; another clause's failure is recorded and
    the run goes on, so a bug two clauses catch (whichever first: a race) is judged by its named clause."""
    from tests.gallery_plugin import Selection

    named = Selection("suites/c10d/test_work.py", clauses=("suites/c10d/test_work.py::test_completed",))
    assert named.stops_at("suites/c10d/test_work.py::test_completed[native-ws2]")
    assert not named.stops_at("suites/c10d/test_work.py::test_future_completes[native-ws2]")
    assert Selection("suites/c10d/test_work.py").stops_at("suites/c10d/test_work.py::test_future_completes[x]")


def test_a_backends_named_clauses_run_first_in_the_places_its_cases_hold():
    """Each plan backend's cases of its named clauses move ahead of its other cases, within the places its cases
    already hold: a caught bug skips the rest of its file, and other backends' cases keep their order."""
    from types import SimpleNamespace

    from tests.gallery_plugin import Selection, _named_clauses_first

    def case(nodeid: str, backend: str):
        return SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(params={"world_target": SimpleNamespace(
            backend=backend)}))

    items = [case("f.py::test_a[bug]", "bug"), case("f.py::test_a[gloo]", "gloo"), case("f.py::test_b[bug]", "bug"),
             case("f.py::test_c[bug]", "bug"), case("f.py::test_c[gloo]", "gloo"), case("f.py::test_d[bug]", "bug"),
             SimpleNamespace(nodeid="f.py::test_plain")]
    plan = {"bug": Selection("f.py", clauses=("f.py::test_c", "f.py::test_d"))}
    assert [item.nodeid for item in _named_clauses_first(items, plan)] == [
        "f.py::test_c[bug]", "f.py::test_a[gloo]", "f.py::test_d[bug]", "f.py::test_a[bug]", "f.py::test_c[gloo]",
        "f.py::test_b[bug]", "f.py::test_plain"]
    assert _named_clauses_first(items, {"bug": Selection("f.py")}) == items  # no clauses named: any failure stops
