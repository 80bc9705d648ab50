"""Clauses with hard-coded devices, planted for tests/test_device_audit.py (run explicitly, never collected).

Each bad_* rank function hands torch.distributed a tensor that is not on the rank's device; on CPU they all
pass, on a GPU each would fail or silently run on the wrong device. good_* does the same with ctx.device.
"""

import torch
import torch.distributed as dist

from fixtures.rank import ctx


def bad_hard_coded_cpu():
    t = torch.full((3,), ctx.rank + 1.0, device=ctx.device).cpu()  # hidden .cpu()
    dist.all_reduce(t)
    return t.tolist()


def bad_device_string():
    t = torch.ones(3, device="cpu")  # stands for "cuda:0": any device that is not the rank's
    dist.broadcast(t, src=0)
    return t.tolist()


def bad_default_device():
    t = torch.zeros(2)  # no device=: lands on the default device, not the rank's
    dist.all_reduce(t)
    return t.tolist()


def good_rank_device():
    t = torch.full((3,), ctx.rank + 1.0, device=ctx.device)
    out = torch.empty(3, device=t.device)  # the device read back from a placed tensor is the rank's
    out.copy_(t * 2)
    dist.all_reduce(out)
    parts = [torch.zeros_like(out) for _ in range(ctx.world_size)]
    dist.all_gather(parts, out)
    return out.cpu().tolist()  # .cpu() to return a result is fine: it reaches no collective


def test_bad_hard_coded_cpu(world):
    world.run(bad_hard_coded_cpu)


def test_bad_device_string(world):
    world.run(bad_device_string)


def test_bad_default_device(world):
    world.run(bad_default_device)


def test_good_rank_device(world):
    world.run(good_rank_device)
