"""Pieces the DDP clauses share: batches, losses, the single-process baseline, comparisons."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from fixtures.rank import ctx
from suites.ddp import models


def device() -> torch.device:
    return torch.device(ctx.device)


def local_batch(seed: int, step: int, rows: int, width: int, rank: int | None = None):
    x, y = models.batch(seed, ctx.rank if rank is None else rank, step, rows, width)
    return x.to(device()), y.to(device())


def global_batch(seed: int, step: int, rows: int, width: int, ranks=None):
    """Every rank's batch at ``step`` concatenated in rank order: the baseline's input."""
    ranks = range(ctx.world_size) if ranks is None else ranks
    parts = [models.batch(seed, r, step, rows, width) for r in ranks]
    return torch.cat([p[0] for p in parts]).to(device()), torch.cat([p[1] for p in parts]).to(device())


def mse(out, target, kind: str):
    return F.mse_loss(out, target, reduction=kind)


def baseline_copy(module: torch.nn.Module) -> torch.nn.Module:
    """The single-process twin: same weights, this rank's device, never wrapped."""
    return copy.deepcopy(module).to(device())


# ---------------------------------------------------------- pytest side
def expect_close(actual: dict, expected: dict, what: str, *, atol: float, rtol: float = 1e-5) -> None:
    """Same names; None where the other is None; tensors within tolerance (message names the tensor)."""
    assert set(actual) == set(expected), f"{what}: names {sorted(actual)} != expected {sorted(expected)}"
    for name in expected:
        a, e = actual[name], expected[name]
        if e is None or a is None:
            assert a is None and e is None, \
                f"{what}: {name}.grad is {'None' if a is None else 'a tensor'}, expected {'None' if e is None else 'a tensor'}"
            continue
        assert a.shape == e.shape, f"{what}: {name} shape {tuple(a.shape)} != expected {tuple(e.shape)}"
        diff = (a.double() - e.double()).abs()
        bound = atol + rtol * e.double().abs()
        bad = (diff > bound).reshape(-1).nonzero().reshape(-1)
        if bad.numel():
            i = int(bad[0])
            raise AssertionError(
                f"{what}: {name}: {bad.numel()} of {e.numel()} elements beyond atol={atol} rtol={rtol}; first at "
                f"flat index {i}: got {a.reshape(-1)[i].item()!r}, expected {e.reshape(-1)[i].item()!r} "
                f"(max abs diff {diff.max().item():.3g})")


def scaled(grads: dict, factor: float) -> dict:
    return {k: None if v is None else v * factor for k, v in grads.items()}
