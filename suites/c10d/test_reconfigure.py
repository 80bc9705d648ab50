"""Contract: a group made with ``enable_reconfigure=True`` becomes whatever set of ranks its handles name (torch 2.14).

torch 2.14's fault-tolerance API: ``init_process_group(..., enable_reconfigure=True)``; each rank's
``dist._get_reconfigure_handle()`` is exchanged out of band (here over the case store); every rank listed
calls ``dist._reconfigure(uuid, handles)``, and the group is then those ranks, numbered by the list's order,
under a uuid no earlier reconfigure of the group used. Measured on gloo under torch 2.14.1
(suites/c10d/fault_tolerance_measure.py), after PyTorch's test/distributed/test_c10d_fault_tolerance.py:

* the backend says so: ``supports_reconfigure``, its options report ``enable_reconfigure``, and it has no
  communicator before the first reconfigure (gloo: "ProcessGroupGloo has not been initialized. Call
  reconfigure() before issuing collectives when enable_reconfigure=True.");
* every rank's handle, twice (fresh uuids): size and ranks unchanged, all_reduce and a send/recv ring exact;
  a set of them (torchcomms' unordered handles): each rank numbered once, all_reduce exact;
* without the last or a middle rank: the survivors are renumbered in order, all_reduce and
  ``broadcast(group_src=0)`` exact;
* every rank alone (a uuid each), then all together again; a late joiner; two disjoint groups merged;
* refused: a uuid used before ("... was already used; each reconfigure() requires a unique uuid"), no
  handles, a handle twice, a list without this rank's own handle; the group stays as it was. PyTorch reuses
  the uuid of a rank alone; the whole group reusing its uuid must be refused on every rank too (gloo refuses
  it on rank 0 only: a gap);
* a group with several backends is refused by all three helpers ("ProcessGroup reconfigure APIs do not
  support process groups with multiple backends.": torch's own rule, checked on rank 0).

Each clause runs in a default group made for it (suites/c10d/fault_tolerance.py); on a torch without the API
it is skipped saying which torch adds it (backends/spec.py TORCH_RELEASE_GAPS).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.c10d import fault_tolerance as ft

pytestmark = pytest.mark.needs(collective="all_reduce", feature="reconfigure")

BROADCAST_VALUE = 42.0


# ---------------------------------------------------------------- rank side
def before_first_reconfigure() -> dict:
    with ft.reconfigurable_default_group("enable"):
        found: dict = {"supports": [dist._supports_reconfigure(), ft.backend().supports_reconfigure],
                       "option": ft.backend().options.enable_reconfigure}
        try:
            ft.summed()
            found["all_reduce"] = "returned"
        except Exception as exc:
            found["all_reduce"] = ft.error(exc)
        ft.reconfigure(1, ft.handles("enable"))  # a group never configured is slow to destroy (gloo: ~10 s)
        found["after"] = ft.facts()
        return found


def ring() -> float:
    """Each rank sends (rank + 1) to the next and receives from the previous; what it received."""
    rank, n = dist.get_rank(), dist.get_world_size()
    send, recv = torch.full((4,), rank + 1.0, device=ctx.device), torch.zeros(4, device=ctx.device)
    works = [dist.isend(send, (rank + 1) % n), dist.irecv(recv, (rank - 1) % n)]
    for work in works:
        work.wait()
    return recv[0].item()


def every_handle_twice() -> list:
    with ft.reconfigurable_default_group("every"):
        seen = []
        for uuid in (100, 101):
            ft.reconfigure(uuid, ft.handles(f"every-{uuid}"))
            seen.append((*ft.facts(), ring()))
        return seen


def unordered() -> tuple[int, int, float]:
    with ft.reconfigurable_default_group("unordered"):
        ft.reconfigure(150, set(ft.handles("unordered")))  # a set: the backend chooses the order
        return ft.facts()


def without_one(excluded: int) -> dict | None:
    with ft.reconfigurable_default_group("shrink"):
        ft.reconfigure(400, ft.handles("shrink-all"))
        handles = ft.handles("shrink-post")
        found = None
        if ctx.rank != excluded:
            ft.reconfigure(401, [h for rank, h in enumerate(handles) if rank != excluded])
            tensor = torch.full((4,), BROADCAST_VALUE if dist.get_rank() == 0 else 0.0, device=ctx.device)
            dist.broadcast(tensor, group_src=0)
            found = {"facts": ft.facts(), "broadcast": tensor[0].item()}
        ft.store_barrier("shrink-done")
        return found


def alone_then_together() -> dict:
    with ft.reconfigurable_default_group("alone"):
        ft.reconfigure(600 + ctx.rank, ft.own_handle())  # disjoint groups: a uuid each
        alone = ft.facts()
        ft.reconfigure(600 + ctx.world_size, ft.handles("together"))
        return {"alone": alone, "together": ft.facts()}


def late_join() -> dict:
    first = max(1, ctx.world_size // 2)
    with ft.reconfigurable_default_group("late"):
        handles = ft.handles("late-first")
        found: dict = {}
        if ctx.rank < first:
            ft.reconfigure(900, handles[:first])
            found["early"] = ft.facts()
        ft.reconfigure(901, ft.handles("late-all"))
        found["all"] = ft.facts()
        return found


def merge() -> dict:
    split = max(1, ctx.world_size // 2)
    with ft.reconfigurable_default_group("merge"):
        handles = ft.handles("merge-parts")
        mine = handles[:split] if ctx.rank < split else handles[split:]
        ft.reconfigure(1000 if ctx.rank < split else 1001, mine)
        part = ft.facts()
        ft.reconfigure(1002, ft.handles("merge-all"))
        return {"part": part, "merged": ft.facts()}


def refused_requests() -> dict:
    """PyTorch's form: each rank alone, then the same uuid again; and the malformed lists."""
    with ft.reconfigurable_default_group("refused"):
        ft.reconfigure(1100 + ctx.rank, ft.own_handle())
        handles = ft.handles("refused")  # taken after the reconfigure: it may give a rank a new handle (gloo does)
        others = [h for rank, h in enumerate(handles) if rank != ctx.rank] or ["not-a-handle"]
        found: dict = {}
        for name, uuid, peers in (("reused uuid", 1100 + ctx.rank, ft.own_handle()),
                                  ("no handles", 1150 + ctx.rank, []),
                                  ("a handle twice", 1160 + ctx.rank, ft.own_handle() * 2),
                                  ("own handle missing", 1170 + ctx.rank, others)):
            try:
                ft.reconfigure(uuid, peers)
                found[name] = "accepted"
            except Exception as exc:
                found[name] = ft.error(exc)
        found["after"] = ft.facts()
        return found


def reused_by_the_group() -> dict:
    """Every rank's handle under uuid 1200, then again under 1200 (each rank's handle as it is then)."""
    with ft.reconfigurable_default_group("reused"):
        ft.reconfigure(1200, ft.handles("reused-first"))
        found: dict = {}
        try:
            ft.reconfigure(1200, ft.handles("reused-again"))
            found["again"] = "accepted"
        except Exception as exc:
            found["again"] = ft.error(exc)
        ft.store_barrier("reused-refused")
        found["after"] = ft.facts()
        return found


def multiple_backends() -> dict | None:
    if ctx.rank != 0:
        return None
    group = dist.ProcessGroup(0, 1)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL)
    found = {}
    for name, call in (("supports_reconfigure", lambda: group.supports_reconfigure),
                       ("get_reconfigure_handle", group.get_reconfigure_handle),
                       ("reconfigure", lambda: group.reconfigure(dist.distributed_c10d.ReconfigureOptions()))):
        try:
            found[name] = f"returned {call()!r}"
        except Exception as exc:
            found[name] = ft.error(exc)
    return found


# ------------------------------------------------------------------ clauses
def test_enable_reconfigure_is_honoured(world):
    """enable_reconfigure=True: the backend supports and reports it, and runs no collective before a reconfigure."""
    n = world.world_size
    for rank, found in enumerate(world.run(before_first_reconfigure)):
        assert found["supports"] == [True, True], f"rank {rank}: _supports_reconfigure(), supports_reconfigure"
        assert found["option"] is True, f"rank {rank}: the backend's options.enable_reconfigure is {found['option']}"
        assert found["all_reduce"] != "returned", \
            f"rank {rank}: an all_reduce before the first reconfigure returned (enable_reconfigure ignored?)"
        assert found["after"] == (n, rank, ft.triangle(n)), f"rank {rank}: (size, rank, all_reduce) after reconfigure"


def test_every_handle_keeps_the_group(world):
    """Reconfigure with every rank's handle, twice: size and ranks kept, all_reduce and a send/recv ring exact."""
    n = world.world_size
    for rank, seen in enumerate(world.run(every_handle_twice)):
        for uuid, facts in zip((100, 101), seen):
            assert facts == (n, rank, ft.triangle(n), float((rank - 1) % n + 1)), \
                f"rank {rank}, uuid {uuid}: (size, rank, all_reduce, value received in the ring)"


def test_a_set_of_handles_numbers_every_rank_once(world):
    """Reconfigure with a set of every handle: the backend's order, each rank numbered once, all_reduce exact."""
    n = world.world_size
    found = world.run(unordered)
    assert sorted(rank for _, rank, _ in found) == list(range(n)), f"(size, rank, all_reduce) per rank: {found}"
    assert all(size == n and value == ft.triangle(n) for size, _, value in found), f"per rank: {found}"


@pytest.mark.min_world_size(2)
@pytest.mark.parametrize("which", ["last", "middle"])
def test_survivors_are_renumbered(world, which):
    """Without the last or a middle rank: the survivors are renumbered in order; all_reduce and broadcast exact."""
    n = world.world_size
    excluded = n - 1 if which == "last" else n // 2
    for rank, found in enumerate(world.run(without_one, excluded)):
        if rank == excluded:
            continue
        new_rank = rank if rank < excluded else rank - 1
        assert found["facts"] == (n - 1, new_rank, ft.triangle(n - 1)), \
            f"rank {rank} (rank {excluded} left): (size, rank, all_reduce)"
        assert found["broadcast"] == BROADCAST_VALUE, f"rank {rank}: broadcast(group_src=0) gave {found['broadcast']}"


def test_every_rank_alone_then_all_together(world):
    """Every rank alone (a uuid each) is a group of one; all together again is the whole group, exact."""
    n = world.world_size
    for rank, found in enumerate(world.run(alone_then_together)):
        assert found["alone"] == (1, 0, 1.0), f"rank {rank}: (size, rank, all_reduce) alone"
        assert found["together"] == (n, rank, ft.triangle(n)), f"rank {rank}: (size, rank, all_reduce) together"


@pytest.mark.min_world_size(2)
def test_late_joiners(world):
    """Ranks that were not in the first reconfigure join the next one; all_reduce over everyone is exact."""
    n, first = world.world_size, max(1, world.world_size // 2)
    for rank, found in enumerate(world.run(late_join)):
        if rank < first:
            assert found["early"] == (first, rank, ft.triangle(first)), f"rank {rank}: the early group"
        assert found["all"] == (n, rank, ft.triangle(n)), f"rank {rank}: (size, rank, all_reduce) with the late joiners"


@pytest.mark.min_world_size(2)
def test_disjoint_groups_merge(world):
    """Two disjoint groups (a uuid each) merge into one: ranks by the handle list, all_reduce exact."""
    n, split = world.world_size, max(1, world.world_size // 2)
    for rank, found in enumerate(world.run(merge)):
        size, base = (split, 0) if rank < split else (n - split, split)
        assert found["part"] == (size, rank - base, ft.triangle(size)), f"rank {rank}: its part before the merge"
        assert found["merged"] == (n, rank, ft.triangle(n)), f"rank {rank}: (size, rank, all_reduce) merged"


def test_bad_requests_are_refused(world):
    """Refused: a uuid used before, no handles, a handle twice, no own handle; the group stays as it was."""
    for rank, found in enumerate(world.run(refused_requests)):
        assert "already used" in found.pop("reused uuid"), f"rank {rank}: a reused uuid (torch: '... already used')"
        assert found.pop("after") == (1, 0, 1.0), f"rank {rank}: (size, rank, all_reduce) of its group after them"
        accepted = [name for name, outcome in found.items() if outcome == "accepted"]
        assert not accepted, f"rank {rank}: accepted {', '.join(accepted)}"


@pytest.mark.needs(clause="test_a_uuid_reused_by_the_whole_group_is_refused")
@pytest.mark.min_world_size(2)
def test_a_uuid_reused_by_the_whole_group_is_refused(world):
    """Every rank reconfigures again under the uuid they used together: every rank refuses, the group still works."""
    n = world.world_size
    for rank, found in enumerate(world.run(reused_by_the_group)):
        assert "already used" in found["again"], f"rank {rank}: the uuid reused by the group: {found['again']}"
        assert found["after"] == (n, rank, ft.triangle(n)), f"rank {rank}: (size, rank, all_reduce) after the refusal"


@pytest.mark.needs(feature="reconfigure_helpers")  # torch's check, before any backend is asked: not "reconfigure"
def test_a_group_of_several_backends_is_refused(world):
    """A group with a backend per device is refused by supports_reconfigure, get_reconfigure_handle, reconfigure."""
    found = world.run(multiple_backends)[0]
    for name, outcome in found.items():
        assert "multiple backends" in outcome, f"{name}: {outcome}"
