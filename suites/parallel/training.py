"""FSDP2 and DDP training runs of one small model, and the single-process baselines they must match.

Every rank builds the same model from a seed and trains on its own batch
(suites/ddp/models.batch: any rank, and the baseline, can rebuild any rank's
batch). FSDP2 and DDP average gradients over ranks, so with a mean loss and
equal batch sizes they must equal one process training on the concatenated
batch. Widths are chosen so parameters do not split evenly at world size 4
(FSDP2 pads its shards).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from fixtures.rank import ctx
from suites.ddp import models

WIDTHS = (6, 10, 7, 1)
ROWS, SEED, LR = 4, 1234, 0.05


def build(seed: int = SEED) -> nn.Sequential:
    return models.mlp(seed, WIDTHS)


def batch(rank: int, step: int):
    return models.batch(SEED, rank, step, ROWS, WIDTHS[0])


def global_batch(world_size: int, step: int):
    parts = [batch(r, step) for r in range(world_size)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _mesh():
    from suites.parallel import common

    return common.mesh((ctx.world_size,))


# ---------------------------------------------------------------- rank side
# mixed-precision policies by name: (parameter/compute dtype, gradient reduction dtype). With
# a float16 reduction FSDP2 takes another path: SUM with a division before and after (to
# avoid overflow) instead of AVG.
POLICIES = {"bfloat16": (torch.bfloat16, torch.float32), "float16": (torch.float16, torch.float16)}


def train_fsdp(steps: int, reshard_after_forward: bool = True, mixed: str = "", seed: int = SEED):
    """FSDP2 per Linear and at the root; SGD; returns (local losses, full parameters)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = build(seed).to(ctx.device)
    policy = MixedPrecisionPolicy(*POLICIES[mixed]) if mixed else MixedPrecisionPolicy()
    mesh = _mesh()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    optim = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = batch(ctx.rank, step)
        loss = F.mse_loss(model(x.to(ctx.device)).float(), y.to(ctx.device))
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    return losses, full_parameters(model)


def full_parameters(model: nn.Module) -> dict:
    """Every parameter's full value on every rank, from the ranks' local shards.

    Gathered with all_gather_object rather than DTensor.full_tensor(): this
    clause is about FSDP2's own collectives, not the functional all_gather the
    DTensor clauses check.
    """
    local = {name: p.to_local().detach().cpu() for name, p in model.named_parameters()}
    shards: list = [None] * ctx.world_size
    dist.all_gather_object(shards, local)
    return {name: torch.cat([s[name] for s in shards]) for name in local}


def train_ddp(steps: int, seed: int = SEED):
    """torch DDP on the default group, same model, batches and optimiser."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(build(seed).to(ctx.device))
    optim = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(ctx.rank, step)
        F.mse_loss(model(x.to(ctx.device)), y.to(ctx.device)).backward()
        optim.step()
        optim.zero_grad()
    return {name: p.detach().cpu() for name, p in model.module.named_parameters()}


# ---------------------------------------------------------- pytest side
def baseline(world_size: int, steps: int, mixed: str = "", device: str = "cpu"):
    """One process, the concatenated batch, plain SGD: (mean of ranks' losses per step, parameters).

    With ``mixed`` (a POLICIES name), FSDP2's policy is simulated: each rank's
    gradient is computed by a low-precision copy of the float32 master on that
    rank's batch, averaged in float32, rounded to the reduce dtype, then applied
    to the float32 master. The low-precision passes run on ``device``: a CUDA
    bfloat16 matmul rounds differently from a CPU one, so the simulation must
    use the ranks' device to be exact (measured on an H200, torch 2.11: a CPU
    simulation is off by up to 1.5e-5 after 5 steps).
    """
    model = build()
    optim = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        if mixed:
            grads, step_losses = [], []
            for rank in range(world_size):
                param_dtype, reduce_dtype = POLICIES[mixed]
                low = copy.deepcopy(model).to(device=device, dtype=param_dtype)
                x, y = batch(rank, step)
                loss = F.mse_loss(low(x.to(device=device, dtype=param_dtype)).float(), y.to(device))
                loss.backward()
                grads.append([p.grad.float().cpu() for p in low.parameters()])
                step_losses.append(loss.item())
            for p, *per_rank in zip(model.parameters(), *grads):
                p.grad = torch.stack(per_rank).mean(0).to(reduce_dtype).float()
            losses.append(sum(step_losses) / world_size)
        else:
            x, y = global_batch(world_size, step)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss.item())
        optim.step()
        optim.zero_grad()
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def baseline_on_rank_device(world_size: int, steps: int, mixed: str):
    """Rank side: ``baseline`` with its low-precision passes on this rank's device."""
    return baseline(world_size, steps, mixed, device=ctx.device)
