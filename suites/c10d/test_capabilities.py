"""Contract: every capability a backend offers works when it is called, not only when it is looked up.

Backends ship capabilities that look present until used (issue 25: XCCL binds
``supportsSplitting``, completion hooks, ``suspend``/``resume`` and memory
stats that fail or answer false). Each clause here calls the thing:

* options round-trip: the timeout and ``group_desc`` a group was created
  with are what its backend (``group._get_backend(device).options._timeout``)
  and c10d (``group.group_desc``, ``_get_pg_config``) report, after
  ``set_timeout``, and again for a subgroup created after one was destroyed;
  ``split_group`` keeps them where the backend splits;
* advertised capabilities: every ``Backend.supports_*`` flag torch 2.13 has
  (backends/spec.py FEATURES) is read from the group's backend and, where it
  is True, exercised; True but failing is a failure, False is a failure too
  unless the backend's spec declares the gap (capabilities are data);
* hooks and state: ``_register_on_completion_hook`` fires once per Work with
  its sequence number and duration, ``_wait_for_pending_works`` returns with
  every Work done, ``suspend``/``resume`` keep the group usable,
  ``memory_stats`` answers a dict;
* the two name sets of the single-buffer collectives (the group methods
  ``all_gather_single``/``_allgather_base``, ``reduce_scatter_single``/
  ``_reduce_scatter_base``, ``all_to_all_single``/``alltoall_base``; read
  from suites/collectives.py's ``group_methods``) give the same result as
  the table's oracle (the ``dist.*`` names are test_entry_points.py's);
* shrink after a death: the remaining ranks shrink a group whose last rank
  aborted its membership (its process stays, so the world survives), then
  shrink again, and the shrunk groups keep the timeout.

Every clause leaves the world as it found it: a default group over all ranks.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import collectives, values
from suites.checks import expect_tensor

CREATED_TIMEOUT = timedelta(seconds=41)
CHANGED_TIMEOUT = timedelta(seconds=43)
RECREATED_TIMEOUT = timedelta(seconds=47)
NUMEL = 6


def summed(group=None) -> torch.Tensor:
    """all_reduce of (rank + 1) over ``group``, on cpu."""
    tensor = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(tensor, group=group)
    return tensor.cpu()


def total(ranks) -> torch.Tensor:
    return torch.full((4,), float(sum(r + 1 for r in ranks)))


def backend_of(group):
    """The c10d Backend that serves ``group`` on this world's device (a Python group answers itself)."""
    return group._get_backend(torch.device(ctx.device))


def error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def reported(group) -> dict:
    """What the backend and c10d say about ``group``: its timeout, description and name."""
    seen: dict = {}
    try:
        seen["timeout"] = backend_of(group).options._timeout
    except Exception as exc:  # the finding: how the accessor fails on this backend
        seen["timeout"] = error(exc)
    seen["group_desc"] = group.group_desc
    seen["pg_config_desc"] = dist.distributed_c10d._get_pg_config(group)["pg_desc"]
    return seen


# ------------------------------------------------------------ rank side: options
def options_round_trip() -> dict:
    """The default group's options; a subgroup's as created, after set_timeout, and a re-created one's."""
    out = {"default": reported(dist.group.WORLD), "bound_device_id": dist.group.WORLD.bound_device_id}
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
    flag = collectives_flag(feature)
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


def collectives_flag(feature: str) -> str:
    from backends.spec import FEATURES

    return FEATURES[feature]


# ------------------------------------------------------ rank side: hooks, state
def completion_hook() -> list:
    """(seq, duration in ms, op type) the hook saw for two all_reduces on a fresh group."""
    group = dist.new_group()
    seen = []
    try:
        group._register_on_completion_hook(
            lambda info: seen.append((info.seq, info.active_duration.total_seconds() * 1000, str(info.op_type))))
        for _ in range(2):
            dist.all_reduce(torch.ones(4, device=ctx.device), group=group, async_op=True).wait()
        deadline = time.monotonic() + 2.0
        while len(seen) < 2 and time.monotonic() < deadline:  # the hook runs on the backend's thread
            time.sleep(0.01)
        time.sleep(0.1)  # a second firing of one Work would come now
    finally:
        dist.barrier()
        dist.destroy_process_group(group)
    return seen


def pending_works() -> list[bool]:
    """is_completed() of three async all_reduces right after _wait_for_pending_works()."""
    group = dist.new_group()
    try:
        works = [dist.all_reduce(torch.ones(1 << 16, device=ctx.device), group=group, async_op=True)
                 for _ in range(3)]
        group._wait_for_pending_works()
        done = [work.is_completed() for work in works]
        for work in works:
            work.wait()
    finally:
        dist.barrier()
        dist.destroy_process_group(group)
    return done


def suspend_resume() -> torch.Tensor:
    """suspend() then resume() of the group's backend; an all_reduce on the group afterwards."""
    group = dist.new_group()
    try:
        backend = backend_of(group)
        dist.barrier(group=group)
        backend.suspend()
        backend.resume()
        return summed(group)
    finally:
        dist.barrier()
        dist.destroy_process_group(group)


def memory_stats() -> object:
    group = dist.new_group()
    try:
        return backend_of(group).memory_stats()
    finally:
        dist.destroy_process_group(group)


# -------------------------------------------------- rank side: the two name sets
def _group_opts(family: str, a: collectives.Args):
    c10d = dist.distributed_c10d
    if family == "all_gather":
        return c10d.AllgatherOptions()
    opts = c10d.ReduceScatterOptions() if family == "reduce_scatter" else c10d.AllToAllOptions()
    if family == "reduce_scatter":
        opts.reduceOp = a.op
    return opts


def _call_group_method(entry: collectives.Collective, method: str, a: collectives.Args):
    """ProcessGroup.<method> (one of the record's group_methods) with the record's buffers."""
    fn = getattr(dist.group.WORLD, method)
    opts = _group_opts(entry.family, a)
    if entry.family == "all_to_all":
        return fn(a.outputs[0], a.inputs[0], [], [], opts)
    return fn(a.outputs[0], a.inputs[0], opts)


def group_method(name: str, method: str) -> list:
    """This rank's result chunks of collective ``name`` called as the group's ``method``."""
    entry = collectives.get(name)
    n = ctx.world_size
    chunks = [values.rank_payload(ctx.rank, NUMEL, "float32", 10 * j).to(ctx.device) for j in range(entry.inputs.count(n))]
    a = collectives.args_for(entry, chunks, lambda j: torch.full((NUMEL,), -1.0, device=ctx.device), group_size=n,
                             is_root=ctx.rank == n - 1, op=dist.ReduceOp.SUM, root=n - 1)
    work = _call_group_method(entry, method, a)
    if work is not None:
        work.wait()
    return [chunk.cpu() for chunk in collectives.result_chunks(entry, a, [NUMEL] * n)]


def expected_group_method(name: str, n: int) -> list:
    entry = collectives.get(name)
    inputs = [[values.rank_payload(r, NUMEL, "float32", 10 * j) for j in range(entry.inputs.count(n))]
              for r in range(n)]
    return entry.oracle(inputs, "sum" if entry.reduces else None, None)


# ------------------------------------------------------ rank side: shrink after death
def shrink_after_death() -> dict | str | None:
    """The last rank aborts its membership of a subgroup; the others shrink it away, reduce, shrink again."""
    n = ctx.world_size
    group = dist.new_group(timeout=CREATED_TIMEOUT)
    summed(group)
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
        out["first"] = (dist.get_process_group_ranks(shrunk), summed(shrunk), reported(shrunk)["timeout"])
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
    """The timeout and group_desc a group was created with are what its backend reports, after set_timeout and re-creation."""
    pg_timeout = timedelta(seconds=world.pg_timeout)
    n = world.world_size
    for rank, out in enumerate(world.run(options_round_trip)):
        where = f"rank {rank}"
        assert out["default"]["timeout"] == pg_timeout, \
            f"{where}: the default group reports timeout {out['default']['timeout']}, created with {pg_timeout}"
        assert out["default"]["group_desc"] == "default_pg", f"{where}: default group desc {out['default']!r}"
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
    flag = collectives_flag(feature)
    results = world.run(advertised_capability, feature)
    record_property("finding", f"{flag}: {[advertised for advertised, _ in results]}")
    for rank, (advertised, failure) in enumerate(results):
        assert not failure, f"rank {rank}: {flag}={advertised!r}, but using it failed: {failure}"
        assert advertised is True, f"rank {rank}: the backend does not advertise {flag} (it is {advertised!r})"


@pytest.mark.needs(feature="completion_hook", collective="all_reduce")
def test_completion_hook_fires_once_per_work(world):
    """_register_on_completion_hook fires once per Work, with increasing sequence numbers and a duration."""
    for rank, seen in enumerate(world.run(completion_hook)):
        assert len(seen) == 2, f"rank {rank}: the hook fired {len(seen)} times for 2 all_reduces: {seen}"
        (seq_a, ms_a, _), (seq_b, ms_b, _) = seen
        assert seq_b > seq_a, f"rank {rank}: sequence numbers {seq_a}, {seq_b} do not increase"
        assert ms_a >= 0 and ms_b >= 0, f"rank {rank}: durations {ms_a} ms, {ms_b} ms"


@pytest.mark.needs(feature="pending_works", collective="all_reduce")
def test_wait_for_pending_works(world):
    """_wait_for_pending_works returns with every Work issued on the group completed."""
    for rank, done in enumerate(world.run(pending_works)):
        assert all(done), f"rank {rank}: after _wait_for_pending_works the Works' is_completed() are {done}"


@pytest.mark.needs(feature="suspend_resume", collective="all_reduce")
def test_suspend_resume_keeps_the_group(world):
    """Backend.suspend() then resume() leaves the group working."""
    for rank, value in enumerate(world.run(suspend_resume)):
        expect_tensor(value, total(range(world.world_size)), f"rank {rank}: all_reduce after suspend/resume")


@pytest.mark.needs(feature="memory_stats")
def test_memory_stats_answers(world):
    """Backend.memory_stats() answers a dict."""
    for rank, stats in enumerate(world.run(memory_stats)):
        assert isinstance(stats, dict), f"rank {rank}: memory_stats() gave {stats!r}"


def name_set_cases() -> list:
    return [pytest.param(entry.name, method, id=f"{entry.name}-{method}",
                         marks=pytest.mark.needs(**entry.need(), entry_point=f"ProcessGroup.{method}"))
            for entry in collectives.TABLE.values() for method in entry.group_methods]


@pytest.mark.parametrize("name,method", name_set_cases())
def test_group_method_names_agree(world, name, method):
    """Each ProcessGroup method name of a single-buffer collective (new and old) gives the oracle's result."""
    expected = expected_group_method(name, world.world_size)
    for rank, (actual, want) in enumerate(zip(world.run(group_method, name, method), expected)):
        assert len(actual) == len(want), f"rank {rank}: {len(actual)} chunks, expected {len(want)}"
        for j, (a, w) in enumerate(zip(actual, want)):
            expect_tensor(a, w, f"group.{method} on rank {rank}, chunk {j}")


@pytest.mark.needs(feature="shrinking", collective="all_reduce")
@pytest.mark.min_world_size(2)
def test_shrink_after_a_rank_died(world):
    """After a rank left a group without a word, shrink_group gives the rest a working group (twice), with the timeout kept."""
    n = world.world_size
    results = world.run(shrink_after_death)
    for rank, out in enumerate(results[:-1]):
        assert not isinstance(out, str), f"rank {rank}: shrink_group raised {out}"
        ranks, value, timeout = out["first"]
        assert ranks == list(range(n - 1)), f"rank {rank}: the shrunk group holds {ranks}"
        expect_tensor(value, total(range(n - 1)), f"rank {rank}: all_reduce on the shrunk group")
        assert timeout == CREATED_TIMEOUT, f"rank {rank}: the shrunk group reports timeout {timeout}"
        if "second" in out:
            ranks, value = out["second"]
            expect_tensor(value, total(range(n - 2)), f"rank {rank}: all_reduce after the second shrink")
