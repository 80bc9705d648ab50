"""The DDP differential suite's pieces: one generated training case, the rank side that
trains it under Join, and the single-process oracle.

A ``Case`` is everything about one example and its repr rebuilds it (what a
failure prints, what ``DISTCONFORM_REPLAY`` takes back: suites/differential.py). The oracle does
not use DDP or any process group: it replays, in the pytest process, what
DDP's averaging means (spec A5, B3): at iteration i the ranks still running
(``iterations[r] > i``) contribute their local gradients, the sum is divided
by the world size (``divide_by_initial_world_size``) or by the number of
those ranks, every running rank gets that gradient and takes the same SGD
step; after Join every rank holds the last joiner's weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.algorithms.join import Join

from fixtures.rank import ctx
from suites.ddp import common, impls, models

LR = 0.05
MODES = {
    "default": {},
    "small_buckets": {"bucket_cap_mb": 64 / 2**20},
    "find_unused": {"find_unused_parameters": True},
    "grad_as_bucket_view": {"gradient_as_bucket_view": True},
}


@dataclass(frozen=True)
class Case:
    """One generated DDP run; its repr rebuilds it (suites/differential.py ``parse_example``)."""

    widths: tuple  # MLP layer widths, input first
    rows: tuple  # samples per rank
    iterations: tuple  # iterations per rank (Join evens them out)
    loss: str = "mean"  # "mean" or "sum" over the local batch
    divide_by_initial_world_size: bool = True
    mode: str = "default"
    seed: int = 0

    @property
    def world_size(self) -> int:
        return len(self.rows)


# ---------------------------------------------------------------- rank side
def train_case(impl: str, case: Case):
    """This rank's per-iteration gradients and final weights, training ``case`` under Join."""
    ddp = impls.wrap(impl, models.mlp(case.seed, case.widths), **MODES[case.mode])
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    grads = []
    with Join([ddp], divide_by_initial_world_size=case.divide_by_initial_world_size):
        for step in range(case.iterations[ctx.rank]):
            x, y = models.batch(case.seed, ctx.rank, step, case.rows[ctx.rank], case.widths[0])
            y = y.expand(-1, case.widths[-1])
            opt.zero_grad(set_to_none=True)
            common.mse(ddp(x.to(common.device())), y.to(common.device()), case.loss).backward()
            grads.append(models.grads_of(ddp.module))
            opt.step()
    return grads, models.params_of(ddp.module)


# ------------------------------------------------------------------ oracle
def expected_of(case: Case):
    """(per rank: per-iteration gradients, final weights shared by every rank)."""
    model = models.mlp(case.seed, case.widths)
    names = [name for name, _ in model.named_parameters()]
    per_rank: list[list[dict]] = [[] for _ in range(case.world_size)]
    for step in range(max(case.iterations)):
        running = [r for r in range(case.world_size) if case.iterations[r] > step]
        total = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
        for r in running:
            x, y = models.batch(case.seed, r, step, case.rows[r], case.widths[0])
            y = y.expand(-1, case.widths[-1])
            model.zero_grad(set_to_none=True)
            common.mse(model(x), y, case.loss).backward()
            for name, p in model.named_parameters():
                total[name] += p.grad
        divisor = case.world_size if case.divide_by_initial_world_size else len(running)
        averaged = {name: total[name] / divisor for name in names}
        for r in running:
            per_rank[r].append(averaged)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p -= LR * averaged[name]
    return per_rank, models.params_of(model)
