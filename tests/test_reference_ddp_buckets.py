"""The reference DDP's buckets and the gradients reduced through them, against torch 2.13's DDP and the spec.

Bucket assignment (a pure function) equals ``dist._compute_bucket_assignment_by_size``
and the spec's values; in gloo worlds of 2 and 3 ranks, and once over the
project's ``reference`` process group, the initial and rebuilt bucket layouts
equal torch's and the gradients are bit for bit torch's in every DDP mode, with
gradient_as_bucket_view, no_sync, comm hooks and odd parameter layouts
(/work/shared/specs/ddp-join-rpc-profiling.md, part D).
"""

from __future__ import annotations

import copy
import random
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from backends.reference.ddp.buckets import BucketCaps, compute_bucket_assignment_by_size
from fixtures.rank import ctx
from tests.reference_cases.ddp_common import (IMPLS, Small, bucket_layout, error_text, grads, same_grads, start_world,
                                               wrap)
from tests.reference_cases.ddp_common import registry, world2, world3  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.timeout(300)


# ================================================================ rank side
class ThreeLayers(nn.Module):
    """The spec's D2 model: 512 -> 512 -> 256 -> 4."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(512, 512), nn.Linear(512, 256), nn.Linear(256, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def train_both(model_fn, iterations, options, batch=4, width=None):
    """Train copies of one model under both DDPs; per iteration, whether the grads agree bit for bit."""
    torch.manual_seed(0)
    base = model_fn()
    models = {impl: wrap(impl, copy.deepcopy(base), **options) for impl in IMPLS}
    agree, layouts = [], {}
    for it in range(iterations):
        gen = torch.Generator().manual_seed(1000 * it + ctx.rank)
        first = next(base.parameters())
        x = torch.randn(batch, width or first.shape[1], generator=gen)
        results = {}
        for impl, ddp in models.items():
            ddp.zero_grad(set_to_none=True)
            ddp(x).square().mean().backward()
            results[impl] = grads(ddp.module)
        agree.append(same_grads(results["reference"], results["torch"]))
    for impl, ddp in models.items():
        layouts[impl] = bucket_layout(impl, ddp)
    return agree, layouts


def rank_initial_layouts(find_unused):
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        out[impl] = bucket_layout(impl, wrap(impl, ThreeLayers(), find_unused_parameters=find_unused))
    return out


def rank_train_both(model_name, iterations, options):
    model_fn = {"three": ThreeLayers, "small": Small}[model_name]
    return train_both(model_fn, iterations, options)


def rank_mean_loss_equals_single_process(impls=IMPLS):
    """D3: mse (mean) loss, 4 samples per rank; DDP grads == one process on all 4*ws samples."""
    torch.manual_seed(0)
    base = Small()
    gen = torch.Generator().manual_seed(7)
    xs = torch.randn(4 * ctx.world_size, 8, generator=gen)
    ys = torch.randn(4 * ctx.world_size, 2, generator=gen)
    single = copy.deepcopy(base)
    nn.functional.mse_loss(single(xs), ys).backward()
    expected = grads(single)
    mine = slice(4 * ctx.rank, 4 * ctx.rank + 4)
    out = {}
    for impl in impls:
        ddp = wrap(impl, copy.deepcopy(base))
        nn.functional.mse_loss(ddp(xs[mine]), ys[mine]).backward()
        out[impl] = max(float((g - e).abs().max()) for g, e in zip(grads(ddp.module), expected))
    return out


def rank_gradient_as_bucket_view():
    """A9: after iteration 1 every .grad lives in its bucket's buffer; values equal the default mode."""
    torch.manual_seed(0)
    base = Small()
    from backends.reference.ddp import DistributedDataParallel

    views = DistributedDataParallel(copy.deepcopy(base), gradient_as_bucket_view=True)
    plain = DistributedDataParallel(copy.deepcopy(base))
    equal, in_buffers = [], []
    for it in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(it + 10 * ctx.rank))
        for ddp in (views, plain):
            ddp(x).sum().backward()  # grads accumulate across iterations, as without zero_grad
        equal.append(same_grads(grads(views.module), grads(plain.module)))
        storages = {b.buffer.untyped_storage().data_ptr() for b in views.reducer.buckets}
        in_buffers.append(all(p.grad.untyped_storage().data_ptr() in storages for p in views.module.parameters()))
    return equal, in_buffers


def rank_no_sync():
    """D7: one no_sync step + one synced step == 2x the mean gradient (same input twice)."""
    out = {}
    torch.manual_seed(0)
    base = Small()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(ctx.rank))
    single = copy.deepcopy(base)
    single(x).sum().backward()
    local = grads(single)
    mean = [g.clone() for g in local]
    for g in mean:
        dist.all_reduce(g)
        g /= ctx.world_size
    for impl in IMPLS:
        ddp = wrap(impl, copy.deepcopy(base))
        with ddp.no_sync():
            ddp(x).sum().backward()
        after_no_sync = max(float((g - e).abs().max()) for g, e in zip(grads(ddp.module), local))
        ddp(x).sum().backward()
        out[impl] = (after_no_sync, max(float((g - 2 * e).abs().max()) for g, e in zip(grads(ddp.module), mean)))
    return out


def rank_comm_hooks():
    """A11: allreduce hooks equal no hook (~1e-7), fp16 within ~1e-3; a second registration raises."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from backends.reference.ddp import allreduce_hook, fp16_compress_hook

    torch.manual_seed(0)
    base = ThreeLayers()
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(ctx.rank))
    hooks = {"none": None, "ref_allreduce": allreduce_hook, "ref_fp16": fp16_compress_hook,
             "torch_allreduce": default_hooks.allreduce_hook, "torch_fp16": default_hooks.fp16_compress_hook}
    out = {}
    for impl in IMPLS:
        results = {}
        for name, hook in hooks.items():
            ddp = wrap(impl, copy.deepcopy(base), bucket_cap_mb=0.25)
            if hook is not None:
                ddp.register_comm_hook(None, hook)
            for _ in range(2):  # before and after the rebuild
                ddp.zero_grad(set_to_none=True)
                ddp(x).sum().backward()
            results[name] = grads(ddp.module)
        reference = results["none"]
        out[impl] = {name: max(float((g - r).abs().max() / (r.abs().max() + 1e-12)) for g, r in zip(gs, reference))
                     for name, gs in results.items()}
        ddp = wrap(impl, copy.deepcopy(base))
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        out[impl]["twice"] = error_text(lambda: ddp.register_comm_hook(None, default_hooks.allreduce_hook))
    return out


def rank_reference_backend_training():
    """The reference DDP over the project's pure-Python process group: D3's closed form."""
    return rank_mean_loss_equals_single_process(("reference",))["reference"]


class OddLayouts(nn.Module):
    """A transposed (column-major) weight and a channels_last convolution: bucket views follow their strides."""

    def __init__(self):
        super().__init__()
        self.t = nn.Parameter(torch.randn(6, 4).t())  # shape (4, 6), strides (1, 4)
        self.conv = nn.Conv2d(2, 3, 2).to(memory_format=torch.channels_last)
        self.head = nn.Linear(27, 2)

    def forward(self, x):
        y = x @ self.t.t()  # (n, 6) -> (n, 4)... reshaped into an image below
        image = y.repeat(1, 8)[:, :32].reshape(-1, 2, 4, 4)
        return self.head(self.conv(image).flatten(1))


def rank_odd_layouts(gradient_as_bucket_view):
    torch.manual_seed(0)
    base = OddLayouts()
    out = {}
    for impl in IMPLS:
        ddp = wrap(impl, copy.deepcopy(base), gradient_as_bucket_view=gradient_as_bucket_view)
        records = []
        for it in range(3):
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(it + 10 * ctx.rank))
            ddp(x).sum().backward()
            records.append(grads(ddp.module))
        out[impl] = (records, [tuple(p.grad.stride()) for p in ddp.module.parameters()])
    return (all(same_grads(a, b) for a, b in zip(out["reference"][0], out["torch"][0])),
            out["reference"][1] == out["torch"][1], out["reference"][1][0])


# ================================================================ pytest side
# ---------------------------------------------------------------- pure
def test_bucket_assignment_spec_values():
    """D1: caps [1 MiB, 25 MiB]: [[0,1],[2],[3,4]] with limits [1 MiB, 1 MiB, 25 MiB]; one cap: dtype groups only."""
    tensors = [torch.zeros(1000), torch.zeros(300000), torch.zeros(10, dtype=torch.float64),
               torch.zeros(200000), torch.zeros(5)]
    limits = [1048576, 26214400]
    assert compute_bucket_assignment_by_size(tensors, limits, [False] * 5) == \
        ([[0, 1], [2], [3, 4]], [1048576, 1048576, 26214400])
    assert compute_bucket_assignment_by_size(tensors, [sys.maxsize], [False] * 5)[0] == [[0, 1, 3, 4], [2]]


def test_bucket_assignment_equals_torch_on_random_inputs():
    """The assignment equals dist._compute_bucket_assignment_by_size on 300 random tensor lists and cap lists."""
    rng = random.Random(1234)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.int64]
    for _ in range(300):
        n = rng.randint(1, 12)
        tensors = [torch.zeros(rng.choice([1, 7, 100, 1000, 5000, 30000]), dtype=rng.choice(dtypes))
                   for _ in range(n)]
        limits = sorted(rng.choice([1, 400, 4000, 40000, 200000, sys.maxsize]) for _ in range(rng.randint(1, 3)))
        sparse = [False] * n
        assert compute_bucket_assignment_by_size(tensors, limits, sparse) == \
            dist._compute_bucket_assignment_by_size(tensors, limits, sparse), (tensors, limits)
        # rebuild form: one dtype, tensors in a given ready order, no sorting
        same = [torch.zeros(t.numel()) for t in tensors]
        order = list(range(n))
        rng.shuffle(order)
        ready = [same[i] for i in order]
        assert compute_bucket_assignment_by_size(ready, limits, sparse, order) == \
            dist._compute_bucket_assignment_by_size(ready, limits, sparse, order)


def test_bucket_caps():
    """Default cap 25 MiB with a 1 MiB first bucket; an explicit cap is used for every bucket."""
    default, explicit = BucketCaps.from_argument(None), BucketCaps.from_argument(2)
    assert (default.bucket_bytes_cap, default.first_bucket_bytes_cap) == (25 * 2**20, 2**20)
    assert (explicit.bucket_bytes_cap, explicit.first_bucket_bytes_cap) == (2 * 2**20, 2 * 2**20)
    assert default.initial_limits(static_graph=False, find_unused_parameters=False) == [sys.maxsize]
    assert default.initial_limits(static_graph=True, find_unused_parameters=True) == [sys.maxsize]
    assert default.initial_limits(static_graph=False, find_unused_parameters=True) == [2**20, 25 * 2**20]
    assert explicit.initial_limits(static_graph=False, find_unused_parameters=True) == [2 * 2**20]


# ---------------------------------------------------------------- buckets and gradients
@pytest.mark.parametrize("find_unused", [False, True])
def test_initial_buckets_match_torch(world2, find_unused):
    """D2: one bucket of 395012 elements; with find_unused_parameters [all but a.weight (132868)], [a.weight]."""
    for result in world2.run(rank_initial_layouts, find_unused):
        assert result["reference"] == result["torch"]
        expected = ([[1, 2, 3, 4, 5], [0]], [132868, 262144]) if find_unused else ([[5, 4, 3, 2, 1, 0]], [395012])
        assert result["reference"][0] in (expected[0], [sorted(b) for b in expected[0]])
        assert result["reference"][1] == expected[1]


MODES = {
    "default": {},
    "find_unused": {"find_unused_parameters": True},
    "small_cap": {"bucket_cap_mb": 0.5},
    "bucket_view": {"gradient_as_bucket_view": True},
    "static_graph": {"static_graph": True},
    "static_find_unused": {"static_graph": True, "find_unused_parameters": True},
}


@pytest.mark.parametrize("mode", MODES)
def test_gradients_and_rebuilt_buckets_equal_torch(world2, mode):
    """Every mode: gradients bit-identical to torch's in each of 4 iterations; same buckets after the rebuild."""
    for agree, layouts in world2.run(rank_train_both, "three", 4, MODES[mode]):
        assert agree == [True] * 4
        assert layouts["reference"] == layouts["torch"]


def test_gradients_equal_torch_world_size_3_small_buckets(world3):
    """Three ranks, many small buckets (cap 0.0001 MiB): bit-identical gradients, same layout."""
    for agree, layouts in world3.run(rank_train_both, "small", 3, {"bucket_cap_mb": 0.0001}):
        assert agree == [True] * 3
        assert layouts["reference"] == layouts["torch"]
        assert len(layouts["reference"][0]) > 1


def test_mean_loss_equals_single_process(world3):
    """D3: mean loss on 4 samples per rank equals one process on all samples (atol 1e-6)."""
    for result in world3.run(rank_mean_loss_equals_single_process):
        assert result["reference"] < 1e-6 and result["torch"] < 1e-6


def test_gradient_as_bucket_view(world2):
    """A9: gradients are views of the bucket buffers and equal the copying mode in every iteration."""
    for equal, in_buffers in world2.run(rank_gradient_as_bucket_view):
        assert equal == [True] * 3
        assert in_buffers == [True] * 3


def test_no_sync_accumulates_then_reduces(world2):
    """D7: inside no_sync the local gradient stays; the next synced step gives 2x the mean."""
    for result in world2.run(rank_no_sync):
        for impl in IMPLS:
            after_no_sync, synced = result[impl]
            assert after_no_sync == 0.0 and synced < 1e-6


def test_comm_hooks(world2):
    """A11: allreduce hooks (reference and torch's default_hooks) equal no hook; fp16 within 1e-3; one hook only."""
    for result in world2.run(rank_comm_hooks):
        for impl in IMPLS:
            errors = result[impl]
            assert errors["ref_allreduce"] < 1e-6 and errors["torch_allreduce"] < 1e-6
            assert 0 < errors["ref_fp16"] < 2e-3 and 0 < errors["torch_fp16"] < 2e-3
        assert result["reference"]["twice"] == result["torch"]["twice"] == \
            "register_comm_hook or register_builtin_comm_hook can only be called once."


@pytest.mark.parametrize("gradient_as_bucket_view", [False, True])
def test_parameter_layouts_are_kept(world2, gradient_as_bucket_view):
    """Bucket views take each parameter's strides (transposed, channels_last): gradients and their strides equal torch's."""
    for same, same_strides, transposed_strides in world2.run(rank_odd_layouts, gradient_as_bucket_view):
        assert same and same_strides
        assert transposed_strides == (1, 4)


# ---------------------------------------------------------------- other process groups
def test_reference_process_group(registry):
    """The reference DDP over the project's pure-Python `reference` process group meets D3."""
    world = start_world(registry, "reference", 2)
    try:
        assert all(err < 1e-6 for err in world.run(rank_reference_backend_training))
    finally:
        world.close()
