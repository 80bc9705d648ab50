"""The models the DDP clauses train, each built identically on every rank from a seed.

Every builder seeds torch's global generator inside ``fork_rng`` (so the
caller's random state is untouched): the same seed gives the same weights on
every rank and in the single-process baseline. Models are small (the whole
suite should cost seconds per world) except ``SpecNet``, whose sizes the
bucket clauses' expected numels (spec D2) are made of.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def seeded(seed: int, build):
    """``build()`` under torch.manual_seed(seed), leaving the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def mlp(seed: int, widths=(6, 8, 4)) -> nn.Sequential:
    """Linear layers of these widths with Tanh between them (no batch-dependent buffers)."""
    def build():
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
            if i:
                layers.append(nn.Tanh())
            layers.append(nn.Linear(n_in, n_out))
        return nn.Sequential(*layers)
    return seeded(seed, build)


def batch(seed: int, rank: int, step: int, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) of ``rank`` at ``step``: any rank (and the baseline) can rebuild any rank's batch."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank * 1009 + step)
    x = torch.randn(rows, width, generator=gen)
    y = torch.randn(rows, 1, generator=gen)
    return x, y


class SpecNet(nn.Module):
    """Spec D2's model: Linear(512,512) -> Linear(512,256) -> Linear(256,4), 395012 parameters."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(512, 512)
        self.b = nn.Linear(512, 256)
        self.c = nn.Linear(256, 4)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


class FlatParams(nn.Module):
    """Spec D1's tensors as parameters, in this order: 1000, 300000, 10 (float64), 200000, 5 elements."""

    SIZES = ((1000, torch.float32), (300000, torch.float32), (10, torch.float64), (200000, torch.float32),
             (5, torch.float32))

    def __init__(self):
        super().__init__()
        self.p = nn.ParameterList(nn.Parameter(torch.full((n,), 0.5, dtype=dtype)) for n, dtype in self.SIZES)

    def forward(self, x):
        return sum((p * x.to(p.dtype)).sum().float() for p in self.p)


class RankBranch(nn.Module):
    """Spec D4: ``p(x) + (q(x) if use_q else 0)``; ``z`` is never used by anyone."""

    def __init__(self):
        super().__init__()
        self.p = nn.Linear(3, 1, bias=False)
        self.q = nn.Linear(3, 1, bias=False)
        self.z = nn.Linear(3, 1, bias=False)
        for layer in (self.p, self.q, self.z):
            nn.init.zeros_(layer.weight)

    def forward(self, x, use_q: bool):
        out = self.p(x)
        if use_q:
            out = out + self.q(x)
        return out


class WithUnused(nn.Module):
    """An MLP with an extra layer ``unused`` the forward never touches (managed index 2 and 3)."""

    def __init__(self, seed: int):
        super().__init__()
        self.body = mlp(seed, (6, 1))  # managed indices 0 (weight), 1 (bias)
        self.unused = seeded(seed + 1, lambda: nn.Linear(6, 1))  # managed indices 2 (weight), 3 (bias)

    def forward(self, x):
        return self.body(x)


class TwoOutputs(nn.Module):
    """Returns (head_a(x), head_b(x)); a loss of only one output leaves the other head without grads."""

    def __init__(self, seed: int):
        super().__init__()
        self.head_a = seeded(seed, lambda: nn.Linear(6, 1))
        self.head_b = seeded(seed + 1, lambda: nn.Linear(6, 1))

    def forward(self, x):
        return self.head_a(x), self.head_b(x)


class SharedAccumulator(nn.Module):
    """PyTorch's test_ddp_shared_grad_acc_unused_params model (issue 41324).

    ``net1.bias`` *is* ``self.bias`` (one tensor, one AccumulateGrad, two
    names), and net1 is never used: a reducer that manages the shared tensor
    twice marks one variable ready twice.
    """

    def __init__(self, seed: int):
        super().__init__()
        def build():
            self.net1 = nn.Linear(10, 5, bias=False)
            self.bias = nn.Parameter(torch.zeros(5))
            self.net1.bias = self.bias
            self.net2 = nn.Linear(10, 5)
        seeded(seed, build)

    def forward(self, x):
        return self.net2(x).sum()


class CountingLinear(nn.Module):
    """Linear(5, 5, bias=False) (spec D8) with a buffer counting its forwards (for buffer sync)."""

    def __init__(self, weight: float = 1.0):
        super().__init__()
        self.lin = nn.Linear(5, 5, bias=False)
        nn.init.constant_(self.lin.weight, weight)
        self.register_buffer("forwards", torch.zeros(1))

    def forward(self, x):
        self.forwards += 1
        return self.lin(x)


def grads_of(module: nn.Module) -> dict[str, torch.Tensor | None]:
    """name -> detached cpu copy of .grad (None stays None)."""
    return {name: None if p.grad is None else p.grad.detach().cpu().clone()
            for name, p in module.named_parameters()}


def params_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().clone() for name, p in module.named_parameters()}
