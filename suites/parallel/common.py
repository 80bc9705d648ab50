"""Pieces the parallel clauses share: the functional-collectives module under its 2.13 names,
cached device meshes, and per-rank inputs whose every reduction is exact."""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol

from fixtures.rank import ctx

# torch 2.13 renamed all_gather_tensor / reduce_scatter_tensor (and their autograd forms) to
# *_single; the old names still work but warn on every call. Use the new name where it exists.
all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
all_gather_autograd = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
reduce_scatter_autograd = (getattr(funcol, "reduce_scatter_single_autograd", None)
                           or funcol.reduce_scatter_tensor_autograd)


def mesh(shape: tuple[int, ...]):
    """The world's DeviceMesh of this shape, built once per world (every rank must enter it)."""
    from torch.distributed.device_mesh import init_device_mesh

    names = ("dp", "tp")[-len(shape):] if len(shape) <= 2 else None
    key = ("device_mesh", shape)
    if key not in ctx.scratch:
        ctx.scratch[key] = init_device_mesh(ctx.device.split(":")[0], shape, mesh_dim_names=names)
    return ctx.scratch[key]


def rank_tensor(rank: int, shape: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """A float32 tensor naming its rank and element (rank*1000 + k + salt/4): sums stay exact."""
    numel = 1
    for dim in shape:
        numel *= dim
    k = torch.arange(numel, dtype=torch.float64)
    return (rank * 1000 + k + salt / 4).to(torch.float32).reshape(shape)


def full_tensor(shape: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """The global tensor every DTensor clause shards: the same on every rank."""
    return rank_tensor(0, shape, salt)
