"""Contract: DDP gradients are the single-process gradients of the whole batch.

With every rank starting from the same weights and taking an equal share of
the batch, a DDP backward leaves on every rank the gradient a single process
computes on all ranks' batches concatenated in rank order: equal for a mean
loss, world_size times smaller for a sum loss (DDP averages, a sum over the
concatenated batch does not). This holds in every reducer mode (one bucket,
many small buckets, find_unused_parameters, static_graph,
gradient_as_bucket_view), over several optimizer steps (so through the bucket
rebuild after the first iteration), for torch's DDP and the reference reducer
on the backend under test (spec A5, D3).
"""

import pytest
import torch

from fixtures.rank import ctx
from suites.ddp import common, impls, models
from suites.ddp.common import expect_close

pytestmark = pytest.mark.needs(feature="ddp")

WIDTHS = (6, 8, 4, 1)
ROWS = 4  # samples per rank (spec D3)
STEPS = 3  # the second backward runs on rebuilt buckets
LR = 0.1
# bucket_cap_mb small enough that the MLP's 105 parameters (420 bytes) fill several buckets
MODES = {
    "default": {},
    "small_buckets": {"bucket_cap_mb": 100 / 2**20},
    "find_unused": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
    "grad_as_bucket_view": {"gradient_as_bucket_view": True},
}


# ---------------------------------------------------------------- rank side
def train_with_baseline(impl, seed, loss_kind, options):
    """STEPS SGD steps of DDP and of its single-process twin; per step (ddp grads, baseline grads)."""
    model = models.mlp(seed, WIDTHS)
    baseline = common.baseline_copy(model)
    ddp = impls.wrap(impl, model, **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    # the sum-loss baseline gradient is world_size x DDP's: scale its step to stay on the same weights
    base_lr = LR if loss_kind == "mean" else LR / ctx.world_size
    base_opt = torch.optim.SGD(baseline.parameters(), lr=base_lr)
    steps = []
    for step in range(STEPS):
        x, y = common.local_batch(seed, step, ROWS, WIDTHS[0])
        opt.zero_grad(set_to_none=True)
        common.mse(ddp(x), y, loss_kind).backward()
        gx, gy = common.global_batch(seed, step, ROWS, WIDTHS[0])
        base_opt.zero_grad(set_to_none=True)
        common.mse(baseline(gx), gy, loss_kind).backward()
        steps.append((models.grads_of(ddp.module), models.grads_of(baseline)))
        opt.step()
        base_opt.step()
    return steps, models.params_of(ddp.module), models.params_of(baseline)


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("impl", impls.impl_params())
@pytest.mark.parametrize("mode", list(MODES))
def test_mean_loss_gradients_equal_baseline(world, impl, mode):
    """Mean loss: every rank's DDP gradient equals the single-process gradient on the concatenated batch (atol 1e-6), every step, in every reducer mode."""
    results = world.run(train_with_baseline, impl, 11, "mean", MODES[mode])
    for rank, (steps, params, base_params) in enumerate(results):
        for step, (grads, base_grads) in enumerate(steps):
            expect_close(grads, base_grads, f"{impl} DDP ({mode}) rank {rank} step {step} grad", atol=1e-6)
        expect_close(params, base_params, f"{impl} DDP ({mode}) rank {rank} weights after {STEPS} steps", atol=1e-6)


@pytest.mark.parametrize("impl", impls.impl_params())
@pytest.mark.parametrize("mode", ["default", "small_buckets"])
def test_sum_loss_gradients_are_baseline_over_world_size(world, impl, mode):
    """Sum loss: world_size x every rank's DDP gradient equals the single-process gradient on the concatenated batch."""
    results = world.run(train_with_baseline, impl, 12, "sum", MODES[mode])
    for rank, (steps, _, _) in enumerate(results):
        for step, (grads, base_grads) in enumerate(steps):
            expect_close(common.scaled(grads, world.world_size), base_grads,
                         f"{impl} DDP ({mode}) rank {rank} step {step}: world_size x grad", atol=1e-5)
