"""Contract: ``context()`` yields a fresh id carrying the worker id, current in its thread only.

A context id is ``(worker_id << 48) | counter`` (worker id = rank), ids of
successive contexts increase by one and ``_get_max_id()`` is the worker's
last id. ``_retrieve_context(id)`` finds it from any thread while it lives;
``_current_context()`` only in the thread that opened it. A nested
``context()`` raises torch's "Already have an autograd context id for this
thread."; an id that is unknown (never issued, or released when its ``with``
exited) raises "Could not find autograd context with id: {id}" from every
lookup. An exception inside the ``with`` propagates unchanged and the context
is still released. A release by id from another thread leaves the opening
thread a stale current id (torch's texts say so). A request sent inside a context runs in that context on
the callee. ``_get_debug_info()`` counts contexts and backward passes.
"""

import threading

from suites.dist_autograd.common import (ALREADY_HAVE, NO_CURRENT, STALE_CURRENT, UNKNOWN, WORKER_BITS, autograd,
                                         constant_len, context_seen_by_callee, leaves, outcome_of, peer_name, rpc,
                                         slow_identity, unknown_id, wait_until)


# ---------------------------------------------------------------- rank side
def ids_of_new_contexts():
    mod = autograd()
    ids, found = [], []
    for _ in range(5):
        with mod.context() as context_id:
            ids.append(context_id)
            found.append(mod._retrieve_context(context_id)._context_id())
    after = outcome_of(mod._retrieve_context, ids[-1])
    return ids, found, mod._get_max_id(), after


def nested_context():
    mod = autograd()
    with mod.context() as outer:
        inner = outcome_of(lambda: mod.context().__enter__())
        still = mod._current_context()._context_id()
    return outer, inner, still


def other_thread_view():
    mod = autograd()
    seen = {}
    with mod.context() as mine:
        def look():
            seen["current"] = outcome_of(mod._current_context)
            seen["by_id"] = outcome_of(lambda: mod._retrieve_context(mine)._context_id())
            with mod.context() as own:
                seen["own"] = own
        thread = threading.Thread(target=look)
        thread.start()
        thread.join(30)
        mine_still = mod._current_context()._context_id()
    return mine, mine_still, seen


def unknown_ids():
    mod = autograd()
    never = unknown_id()
    with mod.context() as released:
        pass
    results = {}
    for label, context_id in (("never", never), ("released", released)):
        results[label] = [outcome_of(fn, context_id) for fn in
                          (mod.get_gradients, mod._retrieve_context, mod._release_context, mod._is_valid_context)]
    results["no_current"] = outcome_of(mod._current_context)
    with mod.context() as alive:
        results["valid"] = outcome_of(mod._is_valid_context, alive)
    return never, released, results


def exception_inside_with():
    mod = autograd()
    seen = {}
    try:
        with mod.context() as context_id:
            seen["id"] = context_id
            raise KeyError("inside the context")
    except KeyError as exc:
        seen["raised"] = str(exc)
    seen["after"] = outcome_of(mod._retrieve_context, seen["id"])
    seen["fresh"] = outcome_of(lambda: mod.context().__enter__() is not None)
    mod._release_context(mod._current_context()._context_id())
    return seen


def callee_runs_in_callers_context():
    mod = autograd()
    with mod.context() as context_id:
        seen, nested = rpc().rpc_sync(peer_name(), context_seen_by_callee)
        forced = rpc().rpc_sync(peer_name(), constant_len)
    return context_id, seen, nested, forced


def debug_info():
    mod = autograd()
    # contexts other workers created may still be on their way out (asynchronous clean-up)
    wait_until(lambda: mod._get_debug_info()["num_autograd_contexts"] == 0)
    rest = mod._get_debug_info()
    with mod.context() as context_id:
        inside = mod._get_debug_info()
        (x,) = leaves([1.0, 2.0])
        loss = slow_identity(x, 0.5).sum()
        thread = threading.Thread(target=mod.backward, args=(context_id, [loss]))
        thread.start()
        wait_until(lambda: mod._get_debug_info()["num_current_backward_passes"] == 1, 5.0)
        during = mod._get_debug_info()
        thread.join(30)
        after = mod._get_debug_info()
    return rest, inside, during, after


# ---------------------------------------------------------------- clauses
def test_context_ids_carry_the_worker_id(rpc_agent):
    """Context ids are (worker id << 48) | counter, consecutive, found by id while alive; _get_max_id() is the worker's last id."""
    for rank, (ids, found, max_id, after) in enumerate(rpc_agent.run(ids_of_new_contexts)):
        assert [i >> WORKER_BITS for i in ids] == [rank] * 5, f"rank {rank}: ids {ids}"
        assert [b - a for a, b in zip(ids, ids[1:])] == [1] * 4, f"rank {rank}: ids {ids} are not consecutive"
        assert found == ids, f"rank {rank}: _retrieve_context(id)._context_id() gave {found} for {ids}"
        assert max_id == (rank << WORKER_BITS) | ((1 << WORKER_BITS) - 1), f"rank {rank}: _get_max_id() {max_id}"
        assert after.raised and after.error.startswith(UNKNOWN.format(ids[-1])), after.describe()


def test_nested_context_raises(rpc_agent):
    """A context() inside another in the same thread raises "Already have an autograd context id for this thread."; the outer one stays current."""
    for rank, (outer, inner, still) in enumerate(rpc_agent.run(nested_context)):
        assert inner.raised and inner.error_type == "RuntimeError" and inner.error.startswith(ALREADY_HAVE), \
            f"rank {rank}: nested context {inner.describe()}"
        assert still == outer, f"rank {rank}: current context became {still}, expected {outer}"


def test_current_context_is_thread_local(rpc_agent):
    """Another thread has no current context but finds the context by id, and opens its own with a different id."""
    for rank, (mine, mine_still, seen) in enumerate(rpc_agent.run(other_thread_view)):
        assert seen["current"].raised and seen["current"].error.startswith(NO_CURRENT), \
            f"rank {rank}: _current_context() in another thread {seen['current'].describe()}"
        assert seen["by_id"].value == mine, f"rank {rank}: _retrieve_context from another thread {seen['by_id']}"
        assert seen["own"] >> WORKER_BITS == rank and seen["own"] != mine and mine_still == mine


def test_unknown_context_ids_raise(rpc_agent):
    """get_gradients, _retrieve_context, _release_context, _is_valid_context of a never-issued or released id raise "Could not find autograd context with id: {id}"; a live id is valid (None)."""
    for rank, (never, released, results) in enumerate(rpc_agent.run(unknown_ids)):
        for label, context_id in (("never", never), ("released", released)):
            for outcome in results[label]:
                assert outcome.raised and outcome.error.startswith(UNKNOWN.format(context_id)), \
                    f"rank {rank}: {label} id {context_id}: {outcome.describe()}"
        assert results["no_current"].error.startswith(NO_CURRENT), results["no_current"].describe()
        assert not results["valid"].raised and results["valid"].value is None, results["valid"].describe()


def test_exception_inside_context_propagates_and_releases(rpc_agent):
    """An exception raised inside `with context()` propagates unchanged, the context is released and a new one can be opened."""
    for rank, seen in enumerate(rpc_agent.run(exception_inside_with)):
        assert seen["raised"] == "'inside the context'", f"rank {rank}: {seen}"
        assert seen["after"].raised and seen["after"].error.startswith(UNKNOWN.format(seen["id"])), seen
        assert seen["fresh"].value is True, f"rank {rank}: a new context after the exception {seen['fresh']}"


def test_callee_runs_in_the_callers_context(rpc_agent):
    """A UDF called inside a context runs with the caller's id as its current context and cannot open its own."""
    for rank, (context_id, seen, nested, forced) in enumerate(rpc_agent.run(callee_runs_in_callers_context)):
        assert seen == context_id, f"rank {rank}: the callee ran in context {seen}, the caller's is {context_id}"
        assert nested.startswith(ALREADY_HAVE), f"rank {rank}: context() inside the callee gave {nested!r}"
        assert forced == 2


def test_debug_info_counts_contexts(rpc_agent):
    """_get_debug_info() has exactly num_autograd_contexts and num_current_backward_passes: 0/0 at rest, 1/0 inside a context, 1/1 while a backward runs, 1/0 after it."""
    for rank, (rest, inside, during, after) in enumerate(rpc_agent.run(debug_info)):
        assert rest == {"num_autograd_contexts": 0, "num_current_backward_passes": 0}, f"rank {rank}: {rest}"
        assert inside == {"num_autograd_contexts": 1, "num_current_backward_passes": 0}, f"rank {rank}: {inside}"
        assert during == {"num_autograd_contexts": 1, "num_current_backward_passes": 1}, f"rank {rank}: {during}"
        assert after == inside, f"rank {rank}: after the backward {after}"


def released_by_another_thread():
    """Thread A opens a context, thread B releases it by id; A then looks at its current context (A is thrown away)."""
    mod = autograd()
    seen = {}
    opened, released = threading.Event(), threading.Event()

    def owner():
        context = mod._new_context()
        seen["id"] = context._context_id()
        opened.set()
        released.wait(30)
        seen["current"] = outcome_of(mod._current_context)
        seen["new"] = outcome_of(mod._new_context)

    thread = threading.Thread(target=owner, daemon=True)
    thread.start()
    opened.wait(30)
    seen["release"] = outcome_of(mod._release_context, seen["id"])
    released.set()
    thread.join(30)
    # releasing inside the with block: its exit finds nothing to release
    try:
        with mod.context() as context_id:
            mod._release_context(context_id)
        seen["exit"] = None
    except RuntimeError as exc:
        seen["exit"] = (context_id, str(exc))
    return seen


def test_release_from_another_thread_leaves_a_stale_id(rpc_agent):
    """A context released by id from another thread is gone, but its thread keeps the stale id: _current_context() says it has no data, a new context says one exists; releasing inside `with` makes its exit raise the unknown-id error."""
    for rank, seen in enumerate(rpc_agent.run(released_by_another_thread)):
        assert not seen["release"].raised, f"rank {rank}: release from another thread {seen['release'].describe()}"
        assert seen["current"].error.startswith(STALE_CURRENT), f"rank {rank}: {seen['current'].describe()}"
        assert seen["new"].error.startswith(ALREADY_HAVE), f"rank {rank}: {seen['new'].describe()}"
        context_id, text = seen["exit"]
        assert text.startswith(UNKNOWN.format(context_id)), f"rank {rank}: exit after release {text!r}"
