"""Rank-side functions of tests/test_run_modes.py (module-level, so World.run can send them)."""

import torch
import torch.distributed as dist

from fixtures.rank import ctx


def backend_string_and_cpu_backend() -> tuple[str, str, float]:
    """What the default group was initialised with, which backend serves the rank's device, and an all_reduce."""
    backend = dist.group.WORLD._get_backend(torch.device(ctx.device))
    t = torch.tensor([float(dist.get_rank() + 1)], device=ctx.device)
    dist.all_reduce(t)
    return dist.get_backend(), type(backend).__name__, t.item()
