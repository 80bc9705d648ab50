"""Contract: every ProcessGroup method of a collective, both names of a single-buffer one, gives the oracle's result.

Every torch.distributed call ends in a ProcessGroup method (``allreduce``, ``allgather``, ``gather``, ...,
lists of tensors and an options object), which is also how a group that c10d does not know is used (a
torch.distributed._dist2 group, suites/c10d/test_dist2.py).

torch 2.13 renamed the ProcessGroup methods every ``dist.*`` single-buffer
call ends in (``all_gather_single``, ``reduce_scatter_single``,
``all_to_all_single``) and forwards the older Backend names
(``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``) to them
and back; out-of-tree backends broke on one of the pair. Each name of a
collective's ``group_methods`` (suites/collectives.py) is called on the
default group with the same rank-specific inputs and must give the table's
oracle result. The ``dist.*`` names (``all_gather_single``,
``all_gather_into_tensor``, ``_all_gather_base``, ...) are
test_entry_points.py's. Every ``--debug-level`` runs them (the wrapper torch
puts around a group at DETAIL is then the group called).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import collectives, values
from suites.checks import expect_tensor

NUMEL = 6


# -------------------------------------------------- rank side: the two name sets
def _call_group_method(entry: collectives.Collective, group, method: str, a: collectives.Args):
    """``group``.<method> (one of the record's group_methods) with the record's buffers."""
    assert entry.group_call is not None, f"{entry.name} names group_methods without a group_call"
    return entry.group_call(getattr(group, method), a)


def group_method(name: str, method: str) -> list:
    """This rank's result chunks of collective ``name`` called as the default group's ``method``."""
    return method_results(dist.group.WORLD, name, method)


def method_results(group, name: str, method: str) -> list:
    """This rank's result chunks of collective ``name`` called as ``group``'s ``method`` (a group of every rank)."""
    entry = collectives.get(name)
    n = ctx.world_size
    chunks = [values.rank_payload(ctx.rank, NUMEL, "float32", 10 * j).to(ctx.device) for j in range(entry.inputs.count(n))]
    a = collectives.args_for(entry, chunks, lambda j: torch.full((NUMEL,), -1.0, device=ctx.device), group_size=n,
                             is_root=ctx.rank == n - 1, op=dist.ReduceOp.SUM, root=n - 1)
    work = _call_group_method(entry, group, method, a)
    if work is not None:
        work.wait()
    return [chunk.cpu() for chunk in collectives.result_chunks(entry, a, [NUMEL] * n)]


def expected_group_method(name: str, n: int) -> list:
    entry = collectives.get(name)
    inputs = [[values.rank_payload(r, NUMEL, "float32", 10 * j) for j in range(entry.inputs.count(n))]
              for r in range(n)]
    return entry.oracle(inputs, "sum" if entry.reduces else None, n - 1 if entry.rooted else None)


# ------------------------------------------------------------------ clauses
def _absent_from_torch(method: str) -> list:
    """A skip for a method this torch's ProcessGroup lacks: the _single names are new in torch 2.13, so on an
    older torch there is nothing to call (not a backend's gap: no backend can offer it)."""
    if hasattr(dist.ProcessGroup, method):
        return []
    return [pytest.mark.skip(reason=f"torch {torch.__version__} has no ProcessGroup.{method} "
                                    "(the *_single method names are new in torch 2.13)")]


def name_set_cases() -> list:
    return [pytest.param(entry.name, method, id=f"{entry.name}-{method}",
                         marks=[pytest.mark.needs(**entry.need(), entry_point=f"ProcessGroup.{method}"),
                                *_absent_from_torch(method)])
            for entry in collectives.TABLE.values() for method in entry.group_methods]


def expect_method_results(results: list, name: str, method: str) -> None:
    """Every rank's result chunks of ``method`` (collective ``name``) are the oracle's."""
    expected = expected_group_method(name, len(results))
    for rank, (actual, want) in enumerate(zip(results, expected)):
        assert len(actual) == len(want), f"rank {rank}: {len(actual)} chunks, expected {len(want)}"
        for j, (a, w) in enumerate(zip(actual, want)):
            if w is not None:  # None: unspecified (a reduce's non-root ranks)
                expect_tensor(a, w, f"group.{method} on rank {rank}, chunk {j}")


@pytest.mark.parametrize("name,method", name_set_cases())
def test_group_method_names_agree(world, name, method):
    """Each ProcessGroup method of a collective (both names of a single-buffer one) gives the oracle's result."""
    expect_method_results(world.run(group_method, name, method), name, method)
