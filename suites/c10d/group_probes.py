"""What the capability clauses ask of a group, on the rank side: a reduction over it, its backend, and what
that backend and c10d report about it (suites/c10d/test_capabilities.py, test_backend_state.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fixtures.rank import ctx


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
    """What the backend and c10d say about ``group``: its timeout (or how asking fails), description, and the
    name and type of the backend that answered (under DETAIL torch's wrapper, where it wrapped the group)."""
    seen: dict = {}
    try:
        backend = backend_of(group)
        seen["backend_type"] = type(backend).__name__
        seen["timeout"] = backend.options._timeout
    except Exception as exc:  # the finding: how the accessor fails on this backend
        seen["timeout"] = error(exc)
    try:  # the backend, whatever form serves the group (its type names that form)
        seen["backend_name"] = backend_of(group).name()
    except Exception as exc:
        seen["backend_name"] = error(exc)
    seen["group_desc"] = group.group_desc
    seen["pg_config_desc"] = dist.distributed_c10d._get_pg_config(group)["pg_desc"]
    return seen
