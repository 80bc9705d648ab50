"""Contract: a group's backend options survive every way torch makes a group, and a shrunk or merged group works.

Issue 25: rebuilt groups that drop their timeout or ``pg_options`` kill jobs at
600 s, and shrinking after a failure is only useful if it works once a rank is
really gone. Each clause calls the thing (what is measured on torch 2.13 is
data in the backends' specs, with the error seen):

* ``pg_options`` round trip: a group made with the backend's own options
  object (gloo: ``ProcessGroupGloo._Options`` with ``_threads``; any other:
  ``Backend.Options(name, timeout)``) and the same ``timeout=`` reports every
  field that object set, plus the name and ranks c10d gave the group; by
  ``new_group``, by destroying and re-creating the DEFAULT group (which keeps
  the description ``default_pg``), by ``split_group`` and by ``shrink_group``
  where the backend splits or shrinks. Torch's own rule, not checked here:
  ``new_group(pg_options=o)`` without ``timeout=`` runs with torch's default
  timeout (1800 s), not ``o._timeout``;
* shrink, inherited vs overridden options: a group shrunk without
  ``pg_options`` times its collectives out after its parent's timeout, one
  shrunk with ``pg_options`` after the timeout those carry (measured by a
  collective one member skips: the backend may not report options);
* shrinking the DEFAULT group, twice where the world allows: the remaining
  ranks get a default group of their own size, numbered as before, described
  ``default:shrunken``, that reduces;
* shrink after a real death: the last rank's process exits; the others shrink
  the default group and reduce over it (twice where the world allows). The
  world is replaced afterwards (``World.run(exits=...)``);
* ``ProcessGroup.merge_remote_group``: every rank's single-rank group merges
  over a store into one group of the world's size that reports the given
  name and description (and timeout, where the backend's options can be read),
  reduces, and times out after the timeout merge was given, not its parent's
  (measured by a collective one member skips).

Every clause but the one that kills a rank leaves the world as it found it: a
default group over all ranks, with the world's own timeout.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx, reinit_process_group
from suites.c10d.group_probes import backend_of, error, summed, total
from suites.checks import expect_tensor

GIVEN_TIMEOUT = timedelta(seconds=37)
REINIT_TIMEOUT = timedelta(seconds=53)
GLOO_THREADS = 3  # not gloo's default (2): a gloo that dropped its pg_options reports 2
NCCL_HIGH_PRIORITY = True  # not NCCL's default (False): an NCCL that dropped its pg_options reports False
PARENT_TIMEOUT = timedelta(seconds=4)  # a shrunk group that inherits times out after this
OVERRIDE_TIMEOUT = timedelta(seconds=1.5)  # ... one given pg_options after this
TIMEOUT_SLACK_S = 2.0  # a timed-out collective fails within its timeout plus this (threads, a loaded host)
# gloo's listening side of a connection waits 5 x the timeout (its pair.h), so 5 x this stays under the harness
# deadline: a merge that cannot connect fails in time
MERGE_TIMEOUT = timedelta(seconds=3)
MERGE_PARENT_TIMEOUT = timedelta(seconds=8)  # the one-rank groups': a merged group that kept it times out after this
DEATH_WAIT_S = 20.0


# ------------------------------------------------------------ rank side: options
def given_options(timeout: timedelta):
    """The backend's own options type, filled with ``timeout`` and a non-default value of each field it has."""
    try:
        current = backend_of(dist.group.WORLD).options
    except Exception:  # a backend torch gives no options (a plugin)
        current = None
    # new_group refuses options of another type than the backend's own ("Expected backend_options argument to
    # be of type ProcessGroupNCCL.Options"); a build without gloo or NCCL lacks their classes
    gloo, nccl = getattr(dist, "ProcessGroupGloo", None), getattr(dist, "ProcessGroupNCCL", None)
    if gloo is not None and isinstance(current, gloo._Options):
        options = gloo._Options()
        options._threads = GLOO_THREADS
    elif nccl is not None and isinstance(current, nccl.Options):
        options = nccl.Options()
        options.is_high_priority_stream = NCCL_HIGH_PRIORITY
    else:
        options = torch._C._distributed_c10d.Backend.Options(dist.get_backend(), timeout)
    options._timeout = timeout
    return options


def _set_fields(options) -> dict:
    # not ``backend``: a backend registered under another name (a seeded subclass) may report its family's
    return {name: getattr(options, name) for name in ("_timeout", "_threads", "is_high_priority_stream")
            if hasattr(options, name)}


def reported_options(group) -> dict | str:
    """The fields the group's backend reports (or how asking fails), with its name and ranks."""
    try:
        options = backend_of(group).options
        seen = _set_fields(options)
        seen["group_name"] = options.group_name
        seen["global_ranks_in_group"] = list(options.global_ranks_in_group)
    except Exception as exc:  # the finding: how the accessor fails on this backend
        return error(exc)
    return seen


def pg_options_round_trip(how: str) -> dict | str | None:
    """Make a group ``how`` with given_options(); what was given, what the backend reports, a reduction."""
    n = ctx.world_size
    if how == "default_reinit":
        given = given_options(REINIT_TIMEOUT)
        reinit_process_group(f"pg-options-{ctx.case_id}", timeout=REINIT_TIMEOUT, pg_options=given)
        try:
            return {"given": _set_fields(given), "reported": reported_options(dist.group.WORLD),
                    "desc": dist.group.WORLD.group_desc,
                    "name": dist.distributed_c10d._get_process_group_name(dist.group.WORLD), "sum": summed()}
        finally:
            reinit_process_group(f"pg-options-{ctx.case_id}-restored")
    given = given_options(GIVEN_TIMEOUT)
    out: dict | str | None
    if how == "new_group":
        group = dist.new_group(timeout=GIVEN_TIMEOUT, pg_options=given, group_desc="probes_pg_options")
    elif how == "split_group":
        try:
            group = dist.split_group(split_ranks=[list(range(n))], timeout=GIVEN_TIMEOUT, pg_options=given,
                                     group_desc="probes_pg_options")
        except Exception as exc:
            return error(exc)
    else:  # shrink_group: the last rank leaves the parent to the others
        shrunk = _shrink_away_last_rank(dist.new_group(), given)
        if shrunk is None or isinstance(shrunk, str):
            return shrunk
        group = shrunk
    out = {"given": _set_fields(given), "reported": reported_options(group), "desc": group.group_desc,
           "name": dist.distributed_c10d._get_process_group_name(group),
           "ranks": dist.get_process_group_ranks(group), "sum": summed(group)}
    dist.destroy_process_group(group)
    if how == "shrink_group":
        dist.barrier()
    return out


def _shrink_away_last_rank(parent, pg_options=None):
    """The last rank leaves ``parent`` to the others: it meets the default group's barrier, destroys ``parent``
    and gets None; the others get the shrunk group (the shrink destroys the parent), or the error's text after
    the same barrier. A caller holding the shrunk group destroys it, then meets that barrier too."""
    n = ctx.world_size
    if ctx.rank == n - 1:
        dist.barrier()
        dist.destroy_process_group(parent)
        return None
    try:
        return dist.shrink_group([n - 1], group=parent, pg_options=pg_options)  # destroys the parent
    except Exception as exc:
        out = error(exc)
        dist.barrier()
        dist.destroy_process_group(parent)
        return out


def _reduced_alone_on_rank0(reduce, done_key: str, measure: bool = True) -> dict:
    """Rank 0 runs ``reduce`` over a group whose other members stay away until it has failed (they wait on
    ``done_key`` in the case store): {"alone": "returned" or its error, "seconds": how long} on rank 0, {} on the
    others and where ``measure`` is False."""
    found: dict[str, object] = {}
    if ctx.rank == 0:
        if measure:
            started = time.monotonic()
            try:
                reduce()
                found["seconds"] = time.monotonic() - started
                found["alone"] = "returned"
            except Exception as exc:
                found["seconds"] = time.monotonic() - started  # before the error is read: a C++ backtrace takes time
                found["alone"] = error(exc)
        ctx.store.set(done_key, "1")
    else:
        ctx.store.wait([done_key], timedelta(seconds=60))
    return found


# --------------------------------------------------- rank side: shrink timeouts
def shrunk_group_timeout(how: str) -> dict | str | None:
    """Shrink a group made with PARENT_TIMEOUT (``how``: inherited, or overridden by pg_options); then rank 0
    reduces alone over the shrunk group: how long until it fails, and with what."""
    parent = dist.new_group(timeout=PARENT_TIMEOUT)
    summed(parent)
    shrunk = _shrink_away_last_rank(parent, given_options(OVERRIDE_TIMEOUT) if how == "overridden" else None)
    if shrunk is None or isinstance(shrunk, str):
        return shrunk
    out: dict[str, object] = {"sum": summed(shrunk), "ranks": dist.get_process_group_ranks(shrunk)}
    out.update(_reduced_alone_on_rank0(lambda: summed(shrunk), "shrink/alone_done"))
    dist.destroy_process_group(shrunk)
    dist.barrier()
    return out


# ------------------------------------------------ rank side: the default group
def _default_group_facts() -> tuple:
    return dist.get_world_size(), dist.get_rank(), dist.group.WORLD.group_desc, summed()


def shrink_default_group() -> dict | str | None:
    """The last rank leaves the default group to the others, who shrink it; at ws >= 3 once more."""
    n = ctx.world_size
    out: dict | str | None = None
    try:
        if ctx.rank < n - 1:
            dist.shrink_group([n - 1])
            out = {"first": _default_group_facts()}
            if n >= 3 and ctx.rank < n - 2:
                dist.shrink_group([n - 2])
                out["second"] = _default_group_facts()
    except Exception as exc:
        out = error(exc)
    reinit_process_group(f"shrink-default-{ctx.case_id}")  # every rank: the world's default group
    return out


def _wait_until_gone(pid: int) -> bool:
    """Whether process ``pid`` (on this host) ended within DEATH_WAIT_S: gone, or a zombie not yet reaped."""
    end = time.monotonic() + DEATH_WAIT_S
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def shrink_after_a_kill() -> dict | str | None:
    """The last rank's process exits; once it is gone the others shrink the default group (and at ws >= 3
    shrink again). Run with ``exits={last}``: the world is stopped afterwards."""
    n = ctx.world_size
    summed()  # the default group worked with every rank
    if ctx.rank == n - 1:
        ctx.store.set("shrink/dying", str(os.getpid()))
        os._exit(0)  # no atexit, no destroy: a crash as the others see it
    pid = int(ctx.store.get("shrink/dying"))
    if not _wait_until_gone(pid):
        return f"rank {n - 1} (pid {pid}) was still running {DEATH_WAIT_S:g} s after it said it would exit"
    try:
        dist.shrink_group([n - 1])
        out: dict = {"first": _default_group_facts()}
        if n >= 3 and ctx.rank < n - 2:
            dist.shrink_group([n - 2])
            out["second"] = _default_group_facts()
    except Exception as exc:
        return error(exc)
    return out


# ---------------------------------------------------------- rank side: merge
def merge_single_rank_groups() -> dict | str:
    """Each rank's own one-rank group merges with the others' over a store into one group; then rank 0 reduces
    alone over it: how long until that fails, and with what."""
    n = ctx.world_size
    mine = None
    for r in range(n):  # new_group is entered by every rank of the world
        group = dist.new_group([r], timeout=MERGE_PARENT_TIMEOUT)
        if r == ctx.rank:
            mine = group
    out: dict | str
    merged = None
    try:
        merged = mine.merge_remote_group(dist.PrefixStore("merge", ctx.store.clone()), n, MERGE_TIMEOUT,
                                         f"probes_merged_{ctx.case_id}", "probes_merged")
        if merged is None:
            out = "merge_remote_group returned None"
        else:
            tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
            merged.allreduce(tensor).wait()
            try:
                timeout = merged._get_backend(torch.device(ctx.device)).options._timeout
            except Exception as exc:  # a plugin backend has no options accessor (the backend_options gap)
                timeout = error(exc)
            out = {"rank": merged.rank(), "size": merged.size(), "name": merged.group_name,
                   "desc": merged.group_desc, "timeout": timeout, "sum": tensor.cpu()}
    except Exception as exc:
        out = error(exc)
    alone = _reduced_alone_on_rank0(lambda: merged.allreduce(torch.ones(4, device=ctx.device)).wait(),
                                    "merge_alone_done", measure=not isinstance(out, str) and n >= 2)
    if not isinstance(out, str):  # (a group of one reduces alone at once: nothing measured)
        out.update(alone)
    dist.barrier()  # every rank is done with the merged group before any tears its end of it down
    if merged is not None:
        merged.shutdown()  # made by the C++ ProcessGroup, unknown to c10d's Python registry
    dist.destroy_process_group(mine)
    return out


# ------------------------------------------------------------------ clauses
PG_OPTIONS_WAYS = [
    pytest.param("new_group", marks=pytest.mark.needs(feature="pg_options"), id="new_group"),
    pytest.param("default_reinit", marks=pytest.mark.needs(feature="pg_options"), id="default_reinit"),
    pytest.param("split_group", marks=pytest.mark.needs(feature="splitting"), id="split_group"),
    pytest.param("shrink_group", marks=[pytest.mark.needs(feature="shrinking"), pytest.mark.min_world_size(2)],
                 id="shrink_group"),
]


@pytest.mark.parametrize("how", PG_OPTIONS_WAYS)
@pytest.mark.needs(clause="test_pg_options_round_trip")
def test_pg_options_round_trip(world, how, record_property):
    """The pg_options a group was made with (new_group, default re-init, split, shrink) are what its backend reports."""
    n = world.world_size
    results = world.run(pg_options_round_trip, how)
    for rank, out in enumerate(results):
        if out is None:
            continue  # the rank shrink_group left out
        where = f"rank {rank} ({how})"
        assert not isinstance(out, str), f"{where}: making the group failed: {out}"
        reported = out["reported"]
        if rank == 0:
            record_property("finding", f"{how}: made with {out['given']!r}, reported {reported!r}")
        assert not isinstance(reported, str), f"{where}: the backend's options cannot be read: {reported}"
        for field, value in out["given"].items():
            assert reported.get(field) == value, \
                f"{where}: the backend reports {field}={reported.get(field)!r}, the group was made with {value!r}"
        assert reported["group_name"] == out["name"], \
            f"{where}: the backend reports group_name {reported['group_name']!r}, c10d named it {out['name']!r}"
        if how == "default_reinit":  # (the default group's ranks: [] from gloo, as torch gives them, or all)
            assert out["desc"] == "default_pg", f"{where}: the re-created default group is described {out['desc']!r}"
            expect_tensor(out["sum"], total(range(n)), f"{where}: all_reduce on the re-created default group")
            continue
        assert reported["global_ranks_in_group"] == out["ranks"], \
            f"{where}: the backend reports ranks {reported['global_ranks_in_group']}, the group holds {out['ranks']}"
        expect_tensor(out["sum"], total(out["ranks"]), f"{where}: all_reduce on the group")


@pytest.mark.parametrize("how", ["inherited", "overridden"])
@pytest.mark.needs(feature="shrinking", clause="test_shrunk_group_times_out_as_its_options_say")
@pytest.mark.min_world_size(3)  # rank 0 reduces alone in a shrunk group of two or more
def test_shrunk_group_times_out_as_its_options_say(world, how, record_property):
    """A shrunk group times out after its parent's timeout, or after the one its own pg_options give."""
    n = world.world_size
    want = (PARENT_TIMEOUT if how == "inherited" else OVERRIDE_TIMEOUT).total_seconds()
    results = world.run(shrunk_group_timeout, how, deadline=max(world.deadline, 30.0))
    for rank, out in enumerate(results[:-1]):
        assert not isinstance(out, str), f"rank {rank}: shrink_group raised {out}"
        assert out["ranks"] == list(range(n - 1)), f"rank {rank}: the shrunk group holds {out['ranks']}"
        expect_tensor(out["sum"], total(range(n - 1)), f"rank {rank}: all_reduce on the shrunk group")
    alone = results[0]
    record_property("finding", f"{how}: rank 0 alone: {alone['alone']} after {alone['seconds']:.2f} s")
    assert alone["alone"] != "returned", f"a reduction rank 0 ran alone returned after {alone['seconds']:.2f} s"
    assert want * 0.9 <= alone["seconds"] <= want + TIMEOUT_SLACK_S, \
        f"{how}: a reduction rank 0 ran alone failed after {alone['seconds']:.2f} s, the shrunk group's " \
        f"timeout is {want:g} s (parent {PARENT_TIMEOUT.total_seconds():g} s): {alone['alone']}"


def _check_shrunk_default(rank: int, facts: tuple, size: int, stage: str) -> None:
    world_size, group_rank, desc, value = facts
    where = f"rank {rank} after the {stage} shrink"
    assert (world_size, group_rank) == (size, rank), \
        f"{where}: the default group says rank {group_rank} of {world_size}, expected {rank} of {size}"
    assert desc == "default:shrunken", f"{where}: the default group is described {desc!r}"
    expect_tensor(value, total(range(size)), f"{where}: all_reduce on the shrunk default group")


@pytest.mark.needs(feature="shrinking", clause="test_shrink_the_default_group")
@pytest.mark.min_world_size(2)
def test_shrink_the_default_group(world):
    """shrink_group of the default group gives the remaining ranks a working default group of their size, twice."""
    n = world.world_size
    results = world.run(shrink_default_group)
    for rank, out in enumerate(results[:-1]):
        assert not isinstance(out, str), f"rank {rank}: shrink_group raised {out}"
        _check_shrunk_default(rank, out["first"], n - 1, "first")
        if n >= 3 and rank < n - 2:
            _check_shrunk_default(rank, out["second"], n - 2, "second")


@pytest.mark.needs(feature="shrinking", clause="test_shrink_after_a_rank_was_killed")
@pytest.mark.min_world_size(2)
def test_shrink_after_a_rank_was_killed(world):
    """After a rank's process died, the others shrink the default group and reduce over it, twice."""
    if not world.can_lose_ranks:
        pytest.skip("the ranks are a launcher's: a rank that exits ends the whole launch")
    n = world.world_size
    results = world.run(shrink_after_a_kill, exits={n - 1})
    for rank, out in enumerate(results[:-1]):
        assert not isinstance(out, str), f"rank {rank}: {out}"
        _check_shrunk_default(rank, out["first"], n - 1, "first")
        if n >= 3 and rank < n - 2:
            _check_shrunk_default(rank, out["second"], n - 2, "second")


@pytest.mark.needs(feature="merge_remote_group")
def test_merge_remote_group(world, record_property):
    """merge_remote_group joins every rank's one-rank group into one group with the given name, timeout, ranks."""
    n = world.world_size
    results = world.run(merge_single_rank_groups, deadline=max(world.deadline, 30.0))
    for rank, out in enumerate(results):
        assert not isinstance(out, str), f"rank {rank}: merge_remote_group: {out}"
        assert out["size"] == n, f"rank {rank}: the merged group has {out['size']} ranks"
        assert out["name"] == results[0]["name"] and out["name"].startswith("probes_merged_"), \
            f"rank {rank}: the merged group is named {out['name']!r} (rank 0: {results[0]['name']!r})"
        assert out["desc"] == "probes_merged", f"rank {rank}: the merged group is described {out['desc']!r}"
        if rank == 0:
            record_property("finding", f"the merged group's backend reports timeout {out['timeout']}")
        if not isinstance(out["timeout"], str):  # an unreadable accessor is the backend_options clause's finding
            assert out["timeout"] == MERGE_TIMEOUT, \
                f"rank {rank}: the merged group reports timeout {out['timeout']}, merge was given {MERGE_TIMEOUT}"
        expect_tensor(out["sum"], total(range(n)), f"rank {rank}: all_reduce on the merged group")
    ranks = sorted(out["rank"] for out in results)
    assert ranks == list(range(n)), f"the merged group's ranks are {ranks}, not each of 0..{n - 1} once"
    if n < 2:
        return  # rank 0 is the whole merged group: nobody to stay away from a reduction
    alone, want = results[0], MERGE_TIMEOUT.total_seconds()
    record_property("finding", f"rank 0 alone in the merged group: {alone['alone']} after {alone['seconds']:.2f} s")
    assert alone["alone"] != "returned", f"a reduction rank 0 ran alone returned after {alone['seconds']:.2f} s"
    assert want * 0.9 <= alone["seconds"] <= want + TIMEOUT_SLACK_S, \
        f"a reduction rank 0 ran alone in the merged group failed after {alone['seconds']:.2f} s, merge was given " \
        f"{want:g} s (its one-rank group {MERGE_PARENT_TIMEOUT.total_seconds():g} s): {alone['alone']}"
