"""Contract: parameters a forward does not use, and parameters DDP must not manage.

* find_unused_parameters: a parameter no rank used keeps ``.grad`` as it was
  (None stays None); one used on some ranks only gets, on every rank, the
  average over all ranks with the non-users counting zero (spec A6, D4).
* find_unused_parameters and an output the loss ignores: torch 2.13 treats
  that output's parameters as unused (grad None) and raises nothing.
* Without find_unused_parameters an unused parameter leaves the reduction
  unfinished; the next forward with grad enabled raises torch's error naming
  the rank and the parameter indices; a forward under no_grad does not
  (A7, D5).
* A tensor shared by two names (one AccumulateGrad) is managed once: the
  shared-accumulator model trains 6 iterations with static_graph on and off
  (A1, D6).
* parameters_to_ignore: an ignored parameter is neither broadcast at
  construction nor reduced: its value and gradient stay local (A1).
"""

import pytest
import torch

from fixtures.rank import ctx
from suites.ddp import common, impls, models
from suites.ddp.common import expect_close

pytestmark = pytest.mark.needs(feature="ddp")

UNFINISHED_REDUCTION = ("Expected to have finished reduction in the prior iteration before starting a new one. "
                        "This error indicates that your module has parameters that were not used in producing loss.")


# ---------------------------------------------------------------- rank side
def rank_dependent_branch(impl, iterations=2):
    """Spec D4: rank 0 uses p and q, the others p only, nobody z; x = ones(1,3) * (rank + 1), loss = sum."""
    ddp = impls.wrap(impl, models.RankBranch(), find_unused_parameters=True)
    per_iteration = []
    for _ in range(iterations):
        for p in ddp.parameters():
            p.grad = None
        x = torch.ones(1, 3, device=common.device()) * (ctx.rank + 1)
        ddp(x, use_q=ctx.rank == 0).sum().backward()
        per_iteration.append(models.grads_of(ddp.module))
    return per_iteration


def globally_unused(impl, seed):
    """WithUnused under find_unused: grads of the model and of its single-process twin."""
    model = models.WithUnused(seed)
    baseline = common.baseline_copy(model)
    ddp = impls.wrap(impl, model, find_unused_parameters=True)
    out = []
    for step in range(2):
        x, y = common.local_batch(seed, step, 4, 6)
        common.mse(ddp(x), y, "mean").backward()
        gx, gy = common.global_batch(seed, step, 4, 6)
        common.mse(baseline(gx), gy, "mean").backward()
        out.append((models.grads_of(ddp.module), models.grads_of(baseline)))
    return out


def unused_without_find_unused(impl, seed):
    """Iteration 1 with an unused layer, a no_grad forward, then iteration 2's forward: what each did."""
    ddp = impls.wrap(impl, models.WithUnused(seed))
    x, y = common.local_batch(seed, 0, 4, 6)
    common.mse(ddp(x), y, "mean").backward()
    events = ["iteration 1 ok"]
    try:
        with torch.no_grad():
            ddp(x)
        events.append("no_grad forward ok")
    except RuntimeError as exc:
        events.append(f"no_grad forward raised: {exc}")
    try:
        ddp(x)
        events.append("iteration 2 forward ok")
    except RuntimeError as exc:
        events.append(str(exc))
    return events


def output_left_out_of_loss(impl, seed, iterations=3):
    """TwoOutputs under find_unused, the loss built from head_a's output only."""
    model = models.TwoOutputs(seed)
    baseline = common.baseline_copy(model)
    ddp = impls.wrap(impl, model, find_unused_parameters=True)
    out = []
    for step in range(iterations):
        x, y = common.local_batch(seed, step, 4, 6)
        try:
            common.mse(ddp(x)[0], y, "mean").backward()
        except RuntimeError as exc:
            out.append(str(exc))
            break
        gx, gy = common.global_batch(seed, step, 4, 6)
        common.mse(baseline(gx)[0], gy, "mean").backward()
        out.append((models.grads_of(ddp.module), models.grads_of(baseline)))
        ddp.zero_grad(set_to_none=True)
        baseline.zero_grad(set_to_none=True)
    return out


def shared_accumulator(impl, seed, static_graph, iterations=6):
    model = models.SharedAccumulator(seed)
    baseline = common.baseline_copy(model)
    ddp = impls.wrap(impl, model, find_unused_parameters=True, static_graph=static_graph)
    out = []
    for step in range(iterations):
        x, _ = common.local_batch(seed, step, 10, 10)
        ddp(x).backward()
        gx, _ = common.global_batch(seed, step, 10, 10)
        (baseline(gx) / ctx.world_size).backward()  # a sum per rank, averaged over ranks
        out.append((models.grads_of(ddp.module), models.grads_of(baseline)))
    return out


def ignored_parameter(impl, seed):
    """Layer 0's weight is ignored and made rank-specific before wrapping."""
    model = models.mlp(seed, (6, 1))
    with torch.no_grad():
        model[0].weight.add_(ctx.rank)
    local_weight = model[0].weight.detach().clone()
    impls.ignore_parameters(impl, model, ["0.weight"])
    baseline = common.baseline_copy(model)
    ddp = impls.wrap(impl, model)
    after_init = ddp.module[0].weight.detach().cpu().clone()
    x, y = common.local_batch(seed, 0, 4, 6)
    common.mse(ddp(x), y, "mean").backward()
    common.mse(baseline(x), y, "mean").backward()  # this rank's own gradient
    return local_weight.cpu(), after_init, models.grads_of(ddp.module), models.grads_of(baseline)


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("impl", impls.impl_params())
def test_rank_dependent_control_flow(world, impl):
    """Spec D4: p used by all, q by rank 0 only, z by nobody: p.grad = mean(rank+1), q.grad = 1/world_size on every rank (created where q was unused), z.grad stays None."""
    n = world.world_size
    expected_p, expected_q = sum(range(1, n + 1)) / n, 1 / n
    for rank, per_iteration in enumerate(world.run(rank_dependent_branch, impl)):
        for it, grads in enumerate(per_iteration):
            what = f"{impl} DDP rank {rank} iteration {it}"
            assert grads["z.weight"] is None, f"{what}: globally unused z.weight.grad is {grads['z.weight']}, expected None"
            assert grads["q.weight"] is not None, f"{what}: q.weight.grad is None, expected {expected_q} (used on rank 0)"
            expect_close({"p.weight": grads["p.weight"], "q.weight": grads["q.weight"]},
                         {"p.weight": torch.full((1, 3), expected_p), "q.weight": torch.full((1, 3), expected_q)},
                         what, atol=1e-6)


@pytest.mark.parametrize("impl", impls.impl_params())
def test_globally_unused_parameters_keep_no_grad(world, impl):
    """find_unused_parameters: a layer no rank uses keeps .grad None; the used parameters still equal the baseline."""
    for rank, steps in enumerate(world.run(globally_unused, impl, 31)):
        for step, (grads, base_grads) in enumerate(steps):
            expect_close(grads, base_grads, f"{impl} DDP rank {rank} step {step}", atol=1e-6)


@pytest.mark.parametrize("impl", impls.impl_params())
def test_unused_parameter_error_names_rank_and_indices(world, impl):
    """Without find_unused_parameters, iteration 1 passes, a no_grad forward passes, iteration 2's forward raises torch's error naming the rank and the unused indices 2 3."""
    for rank, events in enumerate(world.run(unused_without_find_unused, impl, 32)):
        what = f"{impl} DDP rank {rank}"
        assert events[:2] == ["iteration 1 ok", "no_grad forward ok"], f"{what}: {events}"
        error = events[2]
        assert error.startswith(UNFINISHED_REDUCTION), f"{what}: iteration 2's forward gave {error!r}"
        expected = f"Parameter indices which did not receive grad for rank {rank}: 2 3"
        assert expected in error, f"{what}: error lacks {expected!r}: {error!r}"


@pytest.mark.parametrize("impl", impls.impl_params())
def test_output_left_out_of_loss_is_unused(world, impl):
    """find_unused_parameters and a forward output the loss ignores: torch 2.13 trains on, that head's grads stay None, the other head's equal the baseline (spec A7's "not all `forward` outputs participate" error is not raised here)."""
    for rank, steps in enumerate(world.run(output_left_out_of_loss, impl, 35)):
        what = f"{impl} DDP rank {rank}"
        assert len(steps) == 3 and all(isinstance(g, tuple) for g in steps), f"{what}: {steps[-1]!r}"
        for step, (grads, base_grads) in enumerate(steps):
            expect_close(grads, base_grads, f"{what} step {step}", atol=1e-6)  # head_b: None on both sides


@pytest.mark.parametrize("impl", impls.impl_params())
@pytest.mark.parametrize("static_graph", [False, True], ids=["dynamic", "static_graph"])
def test_shared_accumulator_model_trains(world, impl, static_graph):
    """Spec D6: the shared-accumulator model (net1.bias is self.bias, net1 unused) runs 6 iterations without error; net2's grads equal the baseline, the unused ones stay None."""
    for rank, steps in enumerate(world.run(shared_accumulator, impl, 33, static_graph)):
        for step, (grads, base_grads) in enumerate(steps):
            expect_close(grads, base_grads, f"{impl} DDP rank {rank} iteration {step}", atol=1e-5)


@pytest.mark.parametrize("impl", impls.impl_params())
def test_parameters_to_ignore_stay_local(world, impl):
    """parameters_to_ignore: the ignored weight keeps this rank's value at construction and its own local gradient; the bias is averaged."""
    results = world.run(ignored_parameter, impl, 34)
    biases = [r[2]["0.bias"] for r in results]
    mean_bias = sum(r[3]["0.bias"] for r in results) / world.world_size
    for rank, (local_weight, after_init, grads, local_grads) in enumerate(results):
        what = f"{impl} DDP rank {rank}"
        assert torch.equal(after_init, local_weight), f"{what}: the ignored weight was overwritten at construction"
        expect_close({"0.weight": grads["0.weight"]}, {"0.weight": local_grads["0.weight"]},
                     f"{what}: ignored weight's grad (must be local)", atol=1e-6)
        expect_close({"0.bias": biases[rank]}, {"0.bias": mean_bias}, f"{what}: managed bias's grad", atol=1e-6)
