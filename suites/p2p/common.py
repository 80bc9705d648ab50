"""Helpers shared by the point-to-point suites (rank side and controller side)."""

from __future__ import annotations

import math

import torch

from fixtures.rank import ctx
from suites import values


def numel_of(shape: tuple) -> int:
    return math.prod(shape)


def payload(rank: int, shape_name: str = "1d", dtype: str = "float32", salt: int = 0) -> torch.Tensor:
    """What ``rank`` sends (on cpu): values.rank_payload shaped; the receiver's expected value."""
    shape = values.SHAPES[shape_name]
    return values.rank_payload(rank, numel_of(shape), dtype, salt).reshape(shape)


def sent(shape_name: str = "1d", dtype: str = "float32", salt: int = 0) -> torch.Tensor:
    """This rank's payload on its device."""
    return payload(ctx.rank, shape_name, dtype, salt).to(ctx.device)


def decoy(expected: torch.Tensor) -> torch.Tensor:
    """A receive buffer (on this rank's device) differing from ``expected`` in every element.

    Whatever element a backend fails to write is then caught by the exact
    comparison, for every dtype (payloads are >= 0, so -x-1 never equals x).
    """
    if expected.dtype == torch.bool:
        buffer = ~expected
    elif expected.dtype.is_floating_point:
        buffer = -expected - 1
    else:
        buffer = expected ^ 1
    return buffer.to(ctx.device)


def neighbours(rank: int, size: int) -> tuple[int, int]:
    """(next, previous) of ``rank`` on a ring of ``size``."""
    return (rank + 1) % size, (rank - 1) % size


def subgroup(ranks) -> object:
    """The subgroup of these global ranks, created once per world.

    new_group is collective over the whole world: every rank must call this,
    members or not, in the same order, which the rank functions guarantee by
    calling it first thing. ctx.scratch is cleared whenever the harness
    re-creates the process groups, so a cached group is never stale.
    """
    import torch.distributed as dist

    key = ("p2p_subgroup", tuple(ranks))
    if key not in ctx.scratch:
        ctx.scratch[key] = dist.new_group(ranks=list(ranks))
    return ctx.scratch[key]
