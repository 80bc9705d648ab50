"""Contract: what a group is created with is what its backend reports, and an advertised capability works.

Backends ship capabilities that look present until they are used (issue 25:
XCCL binds ``supportsSplitting`` and friends that fail or answer false when
called; rebuilt groups that drop their timeout kill jobs at 600 s). Each
clause calls the thing:

* options round-trip: the timeout and ``group_desc`` a group was created
  with are what its backend (``group._get_backend(device).options._timeout``)
  and c10d (``group.group_desc``, ``_get_pg_config``) report, after
  ``set_timeout``, and again for a subgroup created after one was destroyed;
  the default group's ``bound_device_id`` is the ``device_id`` init was given;
  ``split_group`` keeps them where the backend splits;
* advertised capabilities: every ``Backend.supports_*`` flag of torch 2.13
  (backends/spec.py FEATURES) is read from the group's backend and, where it
  is True on any rank, exercised; True but failing is a failure, and so is
  False unless the backend's spec declares the gap (capabilities are data);
* shrink after a death: the remaining ranks shrink a group whose last rank
  aborted its membership without a word (its process stays, so the world
  survives), shrink again at world size 3 and more, and the shrunk groups
  report the timeout their parent reported.

Hooks and backend state are test_backend_state.py's, the method names of the
single-buffer collectives test_method_names.py's. Every clause leaves the
world as it found it: a default group over all ranks.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from backends.spec import FEATURES
from fixtures.rank import ctx
from suites.c10d.group_probes import backend_of, error, reported, summed, total
from suites.checks import expect_tensor

CREATED_TIMEOUT = timedelta(seconds=41)
CHANGED_TIMEOUT = timedelta(seconds=43)
RECREATED_TIMEOUT = timedelta(seconds=47)


# ------------------------------------------------------------ rank side: options
def options_round_trip() -> dict:
    """The default group's options; a subgroup's as created, after set_timeout, and a re-created one's."""
    # the harness passes device_id= to init_process_group under --init eager only (fixtures/devices.py)
    bound_to = torch.device(ctx.device) if ctx.init == "eager" else None
    out = {"default": reported(dist.group.WORLD), "bound_device_id": (dist.group.WORLD.bound_device_id, bound_to)}
    group = dist.new_group(timeout=CREATED_TIMEOUT, group_desc="probes_created")
    out["created"] = reported(group)
    group.set_timeout(CHANGED_TIMEOUT)
    out["changed"] = reported(group)
    out["created_sum"] = summed(group)
    dist.destroy_process_group(group)
    again = dist.new_group(timeout=RECREATED_TIMEOUT, group_desc="probes_recreated")
    out["recreated"] = reported(again)
    out["recreated_sum"] = summed(again)
    dist.destroy_process_group(again)
    return out


def split_keeps_options() -> dict | str:
    """split_group of the default group with a timeout and a description, as the split reports them."""
    n = ctx.world_size
    try:
        split = dist.split_group(split_ranks=[list(range(0, n, 2)), list(range(1, n, 2))],
                                 timeout=CREATED_TIMEOUT, group_desc="probes_split")
    except Exception as exc:
        return error(exc)
    out = reported(split)
    out["sum"] = summed(split)
    dist.destroy_process_group(split)
    return out


# -------------------------------------------------- rank side: advertised flags
def _exercise_splitting(group) -> None:
    split = dist.split_group(group, split_ranks=[list(range(ctx.world_size))])
    expect_tensor(summed(split), total(range(ctx.world_size)), "all_reduce on the split")
    dist.destroy_process_group(split)


def _exercise_shrinking(group) -> None:
    last = ctx.world_size - 1
    if ctx.rank != last:
        shrunk = dist.shrink_group([last], group=group)
        expect_tensor(summed(shrunk), total(range(last)), "all_reduce on the shrunk group")
        dist.destroy_process_group(shrunk)


def _exercise_coalescing(group) -> None:
    a, b = (torch.full((3,), float(ctx.rank + 1), device=ctx.device) for _ in range(2))
    with dist._coalescing_manager(group=group, device=torch.device(ctx.device)):
        dist.all_reduce(a, group=group)
        dist.all_reduce(b, group=group)
    want = torch.full((3,), float(sum(range(1, ctx.world_size + 1))))
    expect_tensor(a.cpu(), want, "first all_reduce coalesced")
    expect_tensor(b.cpu(), want, "second all_reduce coalesced")


def _exercise_time_estimate(group) -> None:
    with dist.distributed_c10d._time_estimator(group=group, device=torch.device(ctx.device)) as estimator:
        dist.all_reduce(torch.ones(4, device=ctx.device), group=group)
    assert estimator.estimated_time is not None and estimator.estimated_time >= 0, \
        f"estimated time {estimator.estimated_time!r}"


def _exercise_tensor_alloc(group) -> None:
    tensor = backend_of(group).allocate_tensor(8, dtype=torch.float32, device=torch.device(ctx.device))
    assert tensor.numel() == 8, f"allocate_tensor(8) gave {tensor.numel()} elements"
    tensor.fill_(ctx.rank + 1)
    dist.all_reduce(tensor, group=group)


EXERCISES = {"splitting": _exercise_splitting, "shrinking": _exercise_shrinking,
             "coalescing": _exercise_coalescing, "time_estimate": _exercise_time_estimate,
             "tensor_alloc": _exercise_tensor_alloc}


def _advertised(backend, flag: str):
    value = getattr(backend, flag, None)
    if callable(value):  # supports_tensor_alloc(device)
        value = value(torch.device(ctx.device))
    return value


def advertised_capability(feature: str) -> tuple[object, str]:
    """(the flag's value on the group's backend, '' or the error exercising it raised); every rank
    exercises it when the flag is True on any rank."""
    flag = FEATURES[feature]
    group = dist.new_group()
    advertised = _advertised(backend_of(group), flag)
    flags = [None] * ctx.world_size
    dist.all_gather_object(flags, bool(advertised))
    failure = ""
    if any(flags):
        try:
            EXERCISES[feature](group)
        except Exception as exc:
            failure = error(exc)
    dist.barrier()
    if not (feature == "shrinking" and any(flags) and not failure and ctx.rank != ctx.world_size - 1):
        dist.destroy_process_group(group)  # shrink_group destroyed it on the ranks that shrank it
    return advertised, failure


# ------------------------------------------------------ rank side: shrink after death
def shrink_after_death() -> dict | str | None:
    """The last rank aborts its membership of a subgroup; the others shrink it away, reduce, shrink again."""
    n = ctx.world_size
    group = dist.new_group(timeout=CREATED_TIMEOUT)
    summed(group)
    parent = reported(group)
    parent_timeout = (str(parent["timeout"]), parent.get("backend_name"), parent.get("backend_type"))
    if ctx.rank == n - 1:
        dist.distributed_c10d._abort_process_group(group)
        ctx.store.set("probes/dead", "1")
        dist.barrier()
        return None
    ctx.store.wait(["probes/dead"], timedelta(seconds=30))
    out: dict | str = {}
    try:
        shrunk = dist.shrink_group([n - 1], group=group)  # destroys ``group`` on success (torch 2.13)
        group = None
        mine = reported(shrunk)
        out["first"] = (dist.get_process_group_ranks(shrunk), summed(shrunk),
                        ((str(mine["timeout"]), mine.get("backend_name"), mine.get("backend_type")), parent_timeout))
        if n >= 3:
            if ctx.rank != n - 2:
                again = dist.shrink_group([n - 2], group=shrunk)
                out["second"] = (dist.get_process_group_ranks(again), summed(again))
                dist.destroy_process_group(again)
            else:
                dist.destroy_process_group(shrunk)
        else:
            dist.destroy_process_group(shrunk)
    except Exception as exc:
        out = error(exc)
    dist.barrier()
    if group is not None:
        dist.destroy_process_group(group)
    return out


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(feature="backend_options")
def test_group_options_round_trip(world):
    """The timeout, group_desc and bound device a group was created with are what its backend reports, after set_timeout and re-creation."""
    pg_timeout = timedelta(seconds=world.pg_timeout)
    n = world.world_size
    for rank, out in enumerate(world.run(options_round_trip)):
        where = f"rank {rank}"
        assert out["default"]["timeout"] == pg_timeout, \
            f"{where}: the default group reports timeout {out['default']['timeout']}, created with {pg_timeout}"
        assert out["default"]["group_desc"] == "default_pg", f"{where}: default group desc {out['default']!r}"
        bound, given = out["bound_device_id"]
        assert bound == given, f"{where}: the default group's bound_device_id is {bound!r}, init was given {given!r}"
        for stage, timeout, desc in (("created", CREATED_TIMEOUT, "probes_created"),
                                     ("changed", CHANGED_TIMEOUT, "probes_created"),
                                     ("recreated", RECREATED_TIMEOUT, "probes_recreated")):
            seen = out[stage]
            assert seen["timeout"] == timeout, f"{where}: the {stage} subgroup reports timeout {seen['timeout']}, " \
                                               f"expected {timeout}"
            assert seen["group_desc"] == desc and seen["pg_config_desc"] == desc, \
                f"{where}: the {stage} subgroup reports desc {seen['group_desc']!r} / pg_config " \
                f"{seen['pg_config_desc']!r}, created with {desc!r}"
        expect_tensor(out["created_sum"], total(range(n)), f"{where}: all_reduce on the subgroup")
        expect_tensor(out["recreated_sum"], total(range(n)), f"{where}: all_reduce on the re-created subgroup")


@pytest.mark.needs(feature="splitting")
@pytest.mark.min_world_size(2)
def test_split_group_keeps_options(world):
    """split_group(timeout=, group_desc=) gives a split whose backend reports that timeout and description."""
    n = world.world_size
    for rank, out in enumerate(world.run(split_keeps_options)):
        assert not isinstance(out, str), f"rank {rank}: split_group raised {out}"
        assert out["timeout"] == CREATED_TIMEOUT, f"rank {rank}: the split reports timeout {out['timeout']}"
        assert out["group_desc"] == "probes_split", f"rank {rank}: the split reports desc {out['group_desc']!r}"
        members = list(range(rank % 2, n, 2))
        expect_tensor(out["sum"], total(members), f"rank {rank}: all_reduce on its split")


@pytest.mark.parametrize("feature", list(EXERCISES))
@pytest.mark.needs(clause="test_advertised_capability_works")
def test_advertised_capability_works(world, feature, record_property):
    """A Backend.supports_* flag is True and the capability works when called; False is a gap the spec must declare."""
    flag = FEATURES[feature]
    results = world.run(advertised_capability, feature)
    record_property("finding", f"{flag}: {[advertised for advertised, _ in results]}")
    for rank, (advertised, failure) in enumerate(results):
        assert not failure, f"rank {rank}: {flag}={advertised!r}, but using it failed: {failure}"
        assert advertised is True, f"rank {rank}: the backend does not advertise {flag} (it is {advertised!r})"


@pytest.mark.needs(feature="shrinking", collective="all_reduce", clause="test_shrink_after_a_rank_died")
@pytest.mark.min_world_size(2)
def test_shrink_after_a_rank_died(world):
    """After a rank left a group without a word, shrink_group gives the rest a working group (twice), keeping its parent's timeout."""
    n = world.world_size
    results = world.run(shrink_after_death)
    for rank, out in enumerate(results[:-1]):
        assert not isinstance(out, str), f"rank {rank}: shrink_group raised {out}"
        ranks, value, timeout = out["first"]
        assert ranks == list(range(n - 1)), f"rank {rank}: the shrunk group holds {ranks}"
        expect_tensor(value, total(range(n - 1)), f"rank {rank}: all_reduce on the shrunk group")
        # what the parent reported (test_group_options_round_trip holds that to the timeout it was created with)
        (shrunk_timeout, shrunk_name, shrunk_type), (parent_timeout, parent_name, parent_type) = timeout
        # the same backend, by its name: a shrunk group may take another form of it (the reference's is a c10d
        # Backend, its parent a ProcessGroup), so the types are named, not compared
        assert (shrunk_timeout, shrunk_name) == (parent_timeout, parent_name), \
            f"rank {rank}: the shrunk group reports timeout {shrunk_timeout} ({shrunk_name}, {shrunk_type}), its " \
            f"parent {parent_timeout} ({parent_name}, {parent_type})"
        if "second" in out:
            ranks, value = out["second"]
            expect_tensor(value, total(range(n - 2)), f"rank {rank}: all_reduce after the second shrink")
