"""Rank-side functions of tests/test_debug_level.py (module-level, so World.run can send them)."""

import torch
import torch.distributed as dist


def debug_level_and_backend():
    """The rank's TORCH_DISTRIBUTED_DEBUG level as torch sees it, and what backend its default group holds."""
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    return dist.get_debug_level().name, type(backend).__name__


def send_rank0_to_rank1():
    """Point-to-point traffic between two of the ranks on the default group: a correct program."""
    if dist.get_rank() == 0:
        dist.send(torch.ones(2), dst=1)
    elif dist.get_rank() == 1:
        dist.recv(torch.empty(2), src=0)


def all_reduce_ranks() -> float:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()
