"""Contract: no_sync accumulation and communication hooks.

* Inside ``no_sync()`` backward does no communication: each rank's .grad is
  its own local gradient; the first synced backward after it all-reduces the
  accumulated gradients (spec A10, D7).
* ``register_comm_hook(state, hook)`` replaces the reducer's all-reduce; the
  gradients are not pre-divided, what the hook's future returns is what lands
  in .grad. torch's allreduce_hook matches the baseline within 1e-6,
  fp16_compress_hook within 1e-3; a second registration raises torch's error
  (A5, A11).
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from suites.ddp import common, impls, models
from suites.ddp.common import expect_close

pytestmark = pytest.mark.needs(feature="ddp")

WIDTHS = (6, 8, 4, 1)
ROWS = 4
HOOKS = {
    "allreduce_hook": (default_hooks.allreduce_hook, 1e-6),
    "fp16_compress_hook": (default_hooks.fp16_compress_hook, 1e-3),
}


def local_only_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A hook that communicates nothing: the bucket as this rank computed it."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


# ---------------------------------------------------------------- rank side
def no_sync_then_sync(impl, seed):
    model = models.mlp(seed, WIDTHS)
    local = common.baseline_copy(model)
    baseline = common.baseline_copy(model)
    ddp = impls.wrap(impl, model)
    x0, y0 = common.local_batch(seed, 0, ROWS, WIDTHS[0])
    with ddp.no_sync():
        common.mse(ddp(x0), y0, "mean").backward()
    inside = models.grads_of(ddp.module)
    common.mse(local(x0), y0, "mean").backward()
    x1, y1 = common.local_batch(seed, 1, ROWS, WIDTHS[0])
    common.mse(ddp(x1), y1, "mean").backward()
    for step in (0, 1):  # the baseline accumulates both global batches
        gx, gy = common.global_batch(seed, step, ROWS, WIDTHS[0])
        common.mse(baseline(gx), gy, "mean").backward()
    return inside, models.grads_of(local), models.grads_of(ddp.module), models.grads_of(baseline)


def train_with_hook(impl, seed, hook_name, steps=3):
    model = models.mlp(seed, WIDTHS)
    baseline = common.baseline_copy(model)
    local = common.baseline_copy(model)
    ddp = impls.wrap(impl, model)
    hook = local_only_hook if hook_name == "local_only" else HOOKS[hook_name][0]
    ddp.register_comm_hook(None, hook)
    out = []
    for step in range(steps):
        for m in (ddp, baseline, local):
            m.zero_grad(set_to_none=True)
        x, y = common.local_batch(seed, step, ROWS, WIDTHS[0])
        common.mse(ddp(x), y, "mean").backward()
        common.mse(local(x), y, "mean").backward()
        gx, gy = common.global_batch(seed, step, ROWS, WIDTHS[0])
        common.mse(baseline(gx), gy, "mean").backward()
        out.append((models.grads_of(ddp.module), models.grads_of(baseline), models.grads_of(local)))
    return out


def register_twice(impl, seed):
    ddp = impls.wrap(impl, models.mlp(seed, WIDTHS))
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    try:
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("impl", impls.impl_params())
def test_no_sync_accumulates_locally_then_syncs(world, impl):
    """Spec D7: inside no_sync .grad is the rank's own gradient; one synced step later it is the sum of both steps' single-process gradients."""
    for rank, (inside, local, after, baseline) in enumerate(world.run(no_sync_then_sync, impl, 41)):
        expect_close(inside, local, f"{impl} DDP rank {rank}: grad inside no_sync (must be local)", atol=1e-6)
        expect_close(after, baseline, f"{impl} DDP rank {rank}: grad after no_sync + synced step", atol=1e-6)


@pytest.mark.parametrize("impl", impls.impl_params())
@pytest.mark.parametrize("hook", list(HOOKS))
def test_comm_hook_gradients_match_baseline(world, impl, hook):
    """torch's allreduce_hook gives the baseline gradient within 1e-6, fp16_compress_hook within 1e-3, every step."""
    tolerance = HOOKS[hook][1]
    for rank, steps in enumerate(world.run(train_with_hook, impl, 42, hook)):
        for step, (grads, baseline, _) in enumerate(steps):
            expect_close(grads, baseline, f"{impl} DDP + {hook} rank {rank} step {step}", atol=tolerance,
                         rtol=tolerance)


@pytest.mark.parametrize("impl", impls.impl_params())
def test_comm_hook_result_is_the_gradient(world, impl):
    """With a hook DDP does not pre-divide: a hook that returns the bucket untouched leaves each rank's own local gradient."""
    for rank, steps in enumerate(world.run(train_with_hook, impl, 43, "local_only")):
        for step, (grads, _, local) in enumerate(steps):
            expect_close(grads, local, f"{impl} DDP + a local-only hook rank {rank} step {step}", atol=1e-6)


@pytest.mark.parametrize("impl", impls.impl_params())
def test_comm_hook_registers_once(world, impl):
    """A second register_comm_hook raises "register_comm_hook or register_builtin_comm_hook can only be called once."."""
    for rank, error in enumerate(world.run(register_twice, impl, 44)):
        assert "register_comm_hook or register_builtin_comm_hook can only be called once." in error, \
            f"{impl} DDP rank {rank}: second registration gave {error!r}"
