"""Contract: bad input raises an error on every rank, within the deadline.

Each case runs in a fresh group with a short timeout, so a backend that would
hang shows up as a timeout error rather than a stuck run. What every rank did
(its error text, or what it silently returned) is recorded as the finding in
the report. The clause fails when a rank dies (a backend that aborts the
process on a user mistake), when a rank silently returns garbage, or when the
case outlives its deadline.
"""

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import collectives
from suites.c10d.timeouts import bounded_group

GROUP_TIMEOUT_S = 0.5


def _mismatched_shapes(group):
    tensor = torch.ones(4 if ctx.rank == 0 else 5, device=ctx.device)
    dist.all_reduce(tensor, group=group)
    return f"returned shape {tuple(tensor.shape)} sum {tensor.sum().item()}"


def _mismatched_dtypes(group):
    tensor = torch.ones(4, dtype=torch.float32 if ctx.rank == 0 else torch.float64, device=ctx.device)
    dist.all_reduce(tensor, group=group)
    return f"returned {tensor.dtype} {tensor.tolist()}"


def _mismatched_collectives(group):
    tensor = torch.ones(4, device=ctx.device)
    if ctx.rank == 0:
        dist.broadcast(tensor, src=0, group=group)
    else:
        dist.all_reduce(tensor, group=group)
    return f"returned {tensor.tolist()}"


def _invalid_broadcast_root(group):
    dist.broadcast(torch.ones(2, device=ctx.device), src=ctx.world_size, group=group)
    return "returned"


def _invalid_reduce_root(group):
    dist.reduce(torch.ones(2, device=ctx.device), dst=-1, group=group)
    return "returned"


def _mismatched_split_sizes(group):
    n = ctx.world_size
    # every rank claims to send 2 to everybody, but rank 0 expects 3 from everybody
    out_splits = [3 if ctx.rank == 0 else 2] * n
    out = torch.zeros(sum(out_splits), device=ctx.device)
    dist.all_to_all_single(out, torch.ones(2 * n, device=ctx.device), output_split_sizes=out_splits,
                           input_split_sizes=[2] * n, group=group)
    return f"returned {out.tolist()}"


CASES = {  # name -> (rank side, the collective it calls: suites/collectives.py states its requirements)
    "all_reduce_mismatched_shapes": (_mismatched_shapes, collectives.need("all_reduce")),
    "all_reduce_mismatched_dtypes": (_mismatched_dtypes, collectives.need("all_reduce")),
    "broadcast_vs_all_reduce": (_mismatched_collectives, collectives.need("broadcast")),
    "broadcast_root_out_of_range": (_invalid_broadcast_root, collectives.need("broadcast")),
    "reduce_root_negative": (_invalid_reduce_root, collectives.need("reduce")),
    "all_to_all_mismatched_splits": (_mismatched_split_sizes, collectives.need("all_to_all_single")),
}
# the cases whose bad input is a disagreement between ranks: one rank has nobody to disagree with
BETWEEN_RANKS = ("all_reduce_mismatched_shapes", "all_reduce_mismatched_dtypes", "broadcast_vs_all_reduce")
for _name, (_, _needs) in CASES.items():
    _needs["bad_input"] = _name


# ---------------------------------------------------------------- rank side
def attempt(case):
    group = bounded_group(GROUP_TIMEOUT_S)
    start = time.perf_counter()
    try:
        outcome = ("returned", CASES[case][0](group))
        seconds = time.perf_counter() - start
    except Exception as exc:
        seconds = time.perf_counter() - start  # before the error is read: rendering a C++ backtrace takes time
        outcome = ("raised", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    # keep the group open until everybody is done with it, then drop it
    ctx.store.set(f"done/{ctx.rank}", "1")
    ctx.store.wait([f"done/{r}" for r in range(ctx.world_size)], timedelta(seconds=60))
    dist.destroy_process_group(group)
    return outcome + (round(seconds, 3),)


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("case", [pytest.param(name, marks=[pytest.mark.needs(**needs)] + (
                                      [pytest.mark.min_world_size(2)] if name in BETWEEN_RANKS else []), id=name)
                                  for name, (_, needs) in CASES.items()])
def test_bad_input_ends_and_is_recorded(world, case, record_property):
    """Bad input (mismatched shapes/dtypes/collectives, invalid roots) raises on every rank within the deadline."""
    results = world.run(attempt, case)
    for rank, (how, detail, seconds) in enumerate(results):
        record_property("finding", f"rank {rank} {how} after {seconds:.2f} s: {detail}")
    silent = {rank: detail for rank, (how, detail, _) in enumerate(results) if how != "raised"}
    assert not silent, f"{case}: no error on rank(s) {sorted(silent)}: {silent}"
