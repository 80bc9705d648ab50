"""The reference DDP reducer (backends/reference/ddp/) against torch 2.13's own DDP and the spec's values.

Pure parts (bucket assignment, parameter selection) run in this process and
are compared with ``dist._compute_bucket_assignment_by_size``. Everything
else runs in persistent gloo worlds (2 and 3 ranks) and, once, over the
project's ``reference`` process group: each case builds the same model
under the reference DDP and under ``torch.nn.parallel.DistributedDataParallel``
and checks the two agree (gradients bit for bit, bucket layouts, error texts),
and that both meet the closed-form values of the spec
(/work/shared/specs/ddp-join-rpc-profiling.md, part D).
"""

from __future__ import annotations

import contextlib
import copy
import random
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from backends.reference.ddp import params as ref_params
from backends.reference.ddp.buckets import BucketCaps, compute_bucket_assignment_by_size
from fixtures.rank import ctx

pytestmark = pytest.mark.timeout(300)

IMPLS = ("reference", "torch")


# ================================================================ rank side
def ddp_class(impl):
    if impl == "reference":
        from backends.reference.ddp import DistributedDataParallel

        return DistributedDataParallel
    return nn.parallel.DistributedDataParallel


def wrap(impl, module, **options):
    return ddp_class(impl)(module, **options)


class ThreeLayers(nn.Module):
    """The spec's D2 model: 512 -> 512 -> 256 -> 4."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(512, 512), nn.Linear(512, 256), nn.Linear(256, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class Small(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, 2)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def bucket_layout(impl, ddp):
    """(indices per bucket, numel per bucket) in reducer order, for either implementation."""
    if impl == "reference":
        return ddp.bucket_indices(), ddp.bucket_numels()
    position = {id(p): i for i, p in enumerate(ddp._module_parameters)}
    buckets = ddp.reducer._get_zeros_like_grad_buckets()
    return [[position[id(p)] for p in b.parameters()] for b in buckets], [b.buffer().numel() for b in buckets]


def grads(module):
    return [None if p.grad is None else p.grad.detach().clone() for p in module.parameters()]


def same_grads(a, b):
    if len(a) != len(b):
        return False
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a, b))


def error_text(fn):
    try:
        fn()
    except RuntimeError as exc:
        return str(exc)
    return None


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


class ControlFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Linear(3, 1, bias=False)
        self.q = nn.Linear(3, 1, bias=False)
        self.z = nn.Linear(3, 1, bias=False)  # never used

    def forward(self, x):
        return self.p(x) + (self.q(x) if ctx.rank == 0 else 0)


def rank_control_flow():
    """D4: rank-dependent control flow with find_unused_parameters."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, ControlFlow(), find_unused_parameters=True)
        ddp(torch.ones(1, 3) * (ctx.rank + 1)).sum().backward()
        m = ddp.module
        out[impl] = (m.p.weight.grad.tolist(), m.q.weight.grad.tolist(), m.z.weight.grad)
    return out


class PartlyUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        return self.used(x)


def rank_unused_without_find_unused():
    """D5: iteration 1 passes, iteration 2's forward raises naming the unused indices; no_grad does not."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, PartlyUsed())
        ddp(torch.ones(2, 3)).sum().backward()
        with torch.no_grad():
            ddp(torch.ones(2, 3))  # must not raise
        out[impl] = error_text(lambda: ddp(torch.ones(2, 3)))
    return out


class SideChannel(nn.Module):
    """Keeps a tensor the loss uses but that is not among the outputs DDP sees."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        self.side = self.a(x)
        return self.a(x) + self.b(x)


def rank_find_unused_error_text():
    """A7 with find_unused_parameters: the loss bypasses the outputs, so b never gets its hook."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, SideChannel(), find_unused_parameters=True)
        ddp(torch.ones(2, 3))
        ddp.module.side.sum().backward()
        out[impl] = error_text(lambda: ddp(torch.ones(2, 3)))
    return out


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        return self.a(x), self.b(x)


def rank_marked_twice():
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, TwoOutputs())
        o1, o2 = ddp(torch.ones(2, 3))
        o1.sum().backward(retain_graph=True)
        out[impl] = error_text(lambda: (o1.sum() + o2.sum()).backward())
    return out


class Switching(nn.Module):
    """Uses ``b`` from the iteration given on."""

    def __init__(self, b_from):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.calls, self.b_from = 0, b_from

    def forward(self, x):
        self.calls += 1
        return self.a(x) + (self.b(x) if self.calls >= self.b_from else 0)


def rank_static_graph(b_from, iterations):
    """static_graph: a parameter unused in iteration 1 stays unused; a later use raises."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, Switching(b_from), static_graph=True)
        errors, b_grads = [], []
        for _ in range(iterations):
            err = error_text(lambda: ddp(torch.ones(2, 3)).sum().backward())
            errors.append(err)
            b_grads.append(None if ddp.module.b.weight.grad is None else ddp.module.b.weight.grad.sum().item())
            if err:
                break
        out[impl] = (errors, b_grads, grads(ddp.module.a))
    return out


class SharedAccumulator(nn.Module):
    """DT test_ddp_shared_grad_acc_unused_params: one bias registered in two modules, one module unused."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 5, bias=False)
        self.bias = nn.Parameter(torch.zeros(5))
        self.net1.bias = self.bias  # shared: one tensor, one AccumulateGrad
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net1(x).sum()


def rank_shared_accumulator(static_graph):
    """D6: 6 iterations with find_unused_parameters do not raise; grads agree with torch."""
    out = {}
    torch.manual_seed(0)
    base = SharedAccumulator()
    for impl in IMPLS:
        ddp = wrap(impl, copy.deepcopy(base), find_unused_parameters=True, static_graph=static_graph)
        for it in range(6):
            ddp.zero_grad(set_to_none=True)
            ddp(torch.ones(4, 10) * (ctx.rank + it)).backward()
        out[impl] = (len(ddp.managed_parameters()) if impl == "reference" else None, grads(ddp.module))
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


def rank_join(divide_by_initial_world_size, iterations_by_rank, find_unused=False, hook=False):
    """D8: Linear(5,5,bias=False), input ones*50, sum loss, uneven iterations; grads of the last iteration."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, nn.Linear(5, 5, bias=False), find_unused_parameters=find_unused)
        if hook:
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        per_iteration = []
        with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size):
            for _ in range(iterations_by_rank[ctx.rank]):
                ddp.zero_grad(set_to_none=True)
                ddp(torch.ones(1, 5) * 50).sum().backward()
                per_iteration.append(ddp.module.weight.grad[0].tolist())
        out[impl] = (per_iteration, ddp._authoritative_rank, ddp.module.weight.detach().sum().item())
    return out


def rank_join_throw(iterations_by_rank):
    """D9: throw_on_early_termination: the first rank out of inputs raises, and so do the others."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, nn.Linear(5, 5, bias=False))

        def loop():
            with ddp.join(throw_on_early_termination=True):
                for _ in range(iterations_by_rank[ctx.rank]):
                    ddp(torch.ones(1, 5)).sum().backward()

        out[impl] = error_text(loop)
    return out


class CountingJoinable:
    """A second Joinable next to DDP in one Join: counts the shadowed iterations."""

    def __new__(cls, *args):
        from torch.distributed.algorithms.join import Joinable, JoinHook

        class Counter(Joinable):
            def __init__(self, device, group):
                super().__init__()
                self.device, self.group, self.shadowed, self.last = device, group, 0, None

            def join_hook(self, **kwargs):
                counter = self

                class Hook(JoinHook):
                    def main_hook(self):
                        counter.shadowed += 1

                    def post_hook(self, is_last_joiner):
                        counter.last = is_last_joiner

                return Hook()

            @property
            def join_device(self):
                return self.device

            @property
            def join_process_group(self):
                return self.group

        return Counter(*args)


def rank_join_with_other_joinable():
    from torch.distributed.algorithms.join import Join

    torch.manual_seed(0)
    ddp = wrap("reference", nn.Linear(5, 5, bias=False))
    counter = CountingJoinable(torch.device("cpu"), dist.group.WORLD)
    with Join([ddp, counter], divide_by_initial_world_size=False):
        for _ in range(1 + 2 * ctx.rank):
            ddp(torch.ones(1, 5)).sum().backward()
    return counter.shadowed, counter.last, ddp._authoritative_rank, ddp.module.weight.grad[0].tolist()


def rank_constructor_errors():
    out = {}
    for impl in IMPLS:
        frozen = nn.Linear(2, 2).requires_grad_(False)
        out[impl] = error_text(lambda: wrap(impl, frozen))
    return out


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x):
        self.seen += x.sum(0).detach()
        return self.lin(x)


def rank_buffers():
    """Rank 0's buffers before every forward (broadcast_buffers), and at construction."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        module = WithBuffer()
        module.seen.fill_(ctx.rank + 7.0)
        ddp = wrap(impl, module)
        at_start = ddp.module.seen.tolist()
        ddp(torch.ones(1, 3) * (ctx.rank + 1)).sum().backward()
        ddp(torch.ones(1, 3) * (ctx.rank + 1)).sum().backward()
        out[impl] = (at_start, ddp.module.seen.tolist())
    return out


def rank_ignored_parameters():
    """parameters_to_ignore: not broadcast, not reduced (grad stays local), not in a bucket."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(ctx.rank)  # different init per rank: the broadcast shows
        module = Small()
        ddp_class(impl)._set_params_and_buffers_to_ignore_for_model(module, ["a.weight"])
        ddp = wrap(impl, module)
        x = torch.ones(2, 8) * (ctx.rank + 1)
        ddp(x).sum().backward()
        gathered = [torch.zeros_like(ddp.module.a.weight) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, ddp.module.a.weight.detach())
        a_weight_differs = not torch.equal(gathered[0], gathered[1])
        b_gathered = [torch.zeros_like(ddp.module.b.weight.grad) for _ in range(ctx.world_size)]
        dist.all_gather(b_gathered, ddp.module.b.weight.grad)
        out[impl] = (a_weight_differs, torch.equal(b_gathered[0], b_gathered[1]),
                     sorted(i for b in bucket_layout(impl, ddp)[0] for i in b))
    return out


def rank_reference_backend_training():
    """The reference DDP over the project's pure-Python process group: D3's closed form."""
    return rank_mean_loss_equals_single_process(("reference",))["reference"]


class Mixture(nn.Module):
    """Four branches the scenario switches on and off per rank and iteration; one may be float64."""

    def __init__(self, double_branch):
        super().__init__()
        self.m0, self.m1, self.m2 = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 4, bias=False)
        self.m3 = nn.Linear(6, 6).double() if double_branch else nn.Linear(6, 6)
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x, mask, as_dict):
        self.steps += 1
        outs = {}
        for i, branch in enumerate((self.m0, self.m1, self.m2, self.m3)):
            if mask[i]:
                y = branch(x.to(next(branch.parameters()).dtype)).float()
                outs[f"o{i}"] = y
        return outs if as_dict else tuple(outs.values())


def mean_into_new_tensor(state, bucket):
    """A comm hook whose result is a new tensor, not the bucket's buffer (the reducer must copy it back)."""
    tensor = bucket.buffer() / dist.get_world_size()
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0] * 1.0)


def run_scenario(impl, base, scenario):
    """Per iteration: the grads (or the error text) one DDP produces for the scenario."""
    torch.manual_seed(0)
    options = {k: scenario[k] for k in ("find_unused_parameters", "static_graph", "gradient_as_bucket_view",
                                        "bucket_cap_mb")}
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
            "new_tensor": mean_into_new_tensor}.get(scenario["hook"])
    record = []
    try:
        ddp = wrap(impl, copy.deepcopy(base), **options)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        for it, step in enumerate(scenario["steps"]):
            if step["zero_grad"]:
                ddp.zero_grad(set_to_none=True)
            x = torch.randn(3, 6, generator=torch.Generator().manual_seed(100 * it + ctx.rank))
            sync = ddp.no_sync() if step["no_sync"] else contextlib.nullcontext()
            with sync:
                out = ddp(x, step["mask"][ctx.rank], scenario["as_dict"])
                values = out.values() if isinstance(out, dict) else out
                sum(v.square().sum() for v in values).backward()
            record.append(grads(ddp.module))
    except RuntimeError as exc:
        record.append(str(exc))
    return record


def describe_difference(a, b):
    for it, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                return f"iteration {it}: {str(x)[:200]!r} vs {str(y)[:200]!r}"
        elif not same_grads(x, y):
            return f"iteration {it}: gradients differ"
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} iterations"
    return None


def rank_scenarios(scenarios):
    """Each scenario under both DDPs; the differences (empty if the reference DDP matches torch exactly)."""
    differences = []
    for number, scenario in enumerate(scenarios):
        torch.manual_seed(number)
        base = Mixture(scenario["double_branch"])
        results = {impl: run_scenario(impl, base, scenario) for impl in IMPLS}
        difference = describe_difference(results["reference"], results["torch"])
        if difference:
            differences.append((number, scenario, difference))
    return differences


def run_join_scenario(impl, base, scenario):
    """Uneven training under ``ddp.join``: per own iteration the grads; then the synced model and the authoritative rank."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(0)
    options = {k: scenario[k] for k in ("find_unused_parameters", "gradient_as_bucket_view", "bucket_cap_mb")}
    record = []
    try:
        ddp = wrap(impl, copy.deepcopy(base), **options)
        if scenario["hook"]:
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        with ddp.join(divide_by_initial_world_size=scenario["divide_by_initial"]):
            for it in range(scenario["iterations"][ctx.rank]):
                step = scenario["steps"][it]
                if step["zero_grad"]:
                    ddp.zero_grad(set_to_none=True)
                x = torch.randn(3, 6, generator=torch.Generator().manual_seed(100 * it + ctx.rank))
                with ddp.no_sync() if step["no_sync"] else contextlib.nullcontext():
                    out = ddp(x, step["mask"][ctx.rank], False)
                    sum(v.square().sum() for v in out).backward()
                record.append(grads(ddp.module))
        record.append([p.detach().clone() for p in ddp.module.parameters()] + [ddp.module.steps.clone()])
        record.append(ddp._authoritative_rank)
    except RuntimeError as exc:
        record.append(str(exc))
    return record


def rank_join_scenarios(scenarios):
    differences = []
    for number, scenario in enumerate(scenarios):
        torch.manual_seed(number)
        base = Mixture(double_branch=False)
        results = {impl: run_join_scenario(impl, base, scenario) for impl in IMPLS}
        ref, tor = results["reference"], results["torch"]
        difference = describe_difference(ref[:-1], tor[:-1]) or (
            None if ref[-1] == tor[-1] else f"authoritative rank {ref[-1]} vs {tor[-1]}")
        if difference:
            differences.append((number, scenario, difference))
    return differences


def rank_join_before_first_iteration():
    """Rank 1 joins at once; rank 0 trains twice with branches m2, m3 unused: their grads stay None."""
    torch.manual_seed(0)
    ddp = wrap("reference", Mixture(double_branch=False), find_unused_parameters=True)
    with ddp.join():
        for _ in range(2 if ctx.rank == 0 else 0):
            out = ddp(torch.ones(3, 6), [True, True, False, False], False)
            sum(v.sum() for v in out).backward()
    return [p.grad is None for p in ddp.module.parameters()]


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


class Checkpointed(nn.Module):
    """One layer run twice under reentrant checkpointing: its hook fires twice per backward."""

    def __init__(self):
        super().__init__()
        self.shared, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        y = checkpoint(self.shared, x, use_reentrant=True)
        y = checkpoint(self.shared, torch.tanh(y), use_reentrant=True)
        return self.head(y)


def rank_reentrant_checkpoint(static_graph):
    """Static graph counts the hook calls of iteration 1 and marks a parameter ready at its last one."""
    torch.manual_seed(0)
    base = Checkpointed()
    out = {}
    for impl in IMPLS:
        ddp = wrap(impl, copy.deepcopy(base), static_graph=static_graph)
        records = []
        for it in range(3):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(it + 10 * ctx.rank)).requires_grad_()
            error = error_text(lambda: ddp(x).sum().backward())
            records.append(error if error else grads(ddp.module))
            if error:
                break
        out[impl] = records
    return describe_difference(out["reference"], out["torch"]), isinstance(out["reference"][0], str)


def rank_subgroup_training():
    """Ranks 1 and 2 of 3 train over a subgroup with uneven inputs; rank 0 is not in it."""
    group = dist.new_group([1, 2])
    if ctx.rank == 0:
        return None
    out = {}
    for impl in IMPLS:
        torch.manual_seed(ctx.rank)  # different init: the broadcast from group rank 0 (global rank 1) shows
        ddp = wrap(impl, Mixture(double_branch=False), process_group=group, bucket_cap_mb=0.0002)
        records = []
        with ddp.join(divide_by_initial_world_size=False):
            for it in range(2 + ctx.rank):
                x = torch.randn(3, 6, generator=torch.Generator().manual_seed(it + 10 * ctx.rank))
                sum(v.sum() for v in ddp(x, [True] * 4, False)).backward()
                records.append(grads(ddp.module))
        records.append([p.detach().clone() for p in ddp.module.parameters()])
        out[impl] = (records, ddp._authoritative_rank)
    return (describe_difference(out["reference"][0], out["torch"][0]), out["reference"][1], out["torch"][1])


def rank_model_mismatch():
    """Rank 1 has one parameter more: construction raises on every rank, naming the counts."""
    out = {}
    for impl in IMPLS:
        module = nn.Sequential(*[nn.Linear(2, 2) for _ in range(1 + ctx.rank)])
        out[impl] = error_text(lambda: wrap(impl, module))
    return out


def rank_shape_mismatch():
    """Rank 1's Linear has one output more: the reference raises on every rank (torch leaves rank 0 in a broadcast)."""
    module = nn.Linear(2, 2 + ctx.rank)
    return error_text(lambda: wrap("reference", module))


# ================================================================ pytest side
@pytest.fixture(scope="module")
def registry():
    from backends.registry import BackendRegistry

    return BackendRegistry()


def _world(registry, backend, size):
    from fixtures.world import World

    return World(registry.get(backend), size, ("cpu",) * size).start()


@pytest.fixture(scope="module")
def world2(registry):
    world = _world(registry, "gloo", 2)
    yield world
    world.close()


@pytest.fixture(scope="module")
def world3(registry):
    world = _world(registry, "gloo", 3)
    yield world
    world.close()


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


def test_managed_parameters_dedup_ignore_and_frozen():
    """Shared parameters are managed once (issue 41324); ignored names and frozen parameters are left out."""
    model = SharedAccumulator()
    params, sparse, names = ref_params.managed_parameters(model, set())
    assert [names[i] for i in range(len(params))] == [".bias", "net1.weight", "net2.weight", "net2.bias"]
    assert len({id(p) for p in params}) == len(params) == 4
    assert sparse == [False] * 4
    model.net2.bias.requires_grad_(False)
    params, _, names = ref_params.managed_parameters(model, {"net1.weight"})
    assert list(names.values()) == [".bias", "net2.weight"]
    # torch's naming quirk: a root parameter is ".bias" in this walk, so "bias" does not ignore it
    params, _, names = ref_params.managed_parameters(model, {"bias"})
    assert ".bias" in names.values()


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


def test_rank_dependent_control_flow(world2):
    """D4: p.grad == 1.5, q.grad == 0.5 on both ranks (locally unused on rank 1), never-used z keeps grad None."""
    for result in world2.run(rank_control_flow):
        assert result["reference"] == result["torch"] == ([[1.5, 1.5, 1.5]], [[0.5, 0.5, 0.5]], None)


# ---------------------------------------------------------------- errors
def test_unused_parameter_without_find_unused_raises_on_next_forward(world2):
    """D5/A7: the next grad-enabled forward raises torch's exact text naming indices 2 3; no_grad does not raise."""
    for rank, result in enumerate(world2.run(rank_unused_without_find_unused)):
        assert result["reference"] == result["torch"]
        assert f"Parameter indices which did not receive grad for rank {rank}: 2 3" in result["reference"]


def test_find_unused_error_text(world2):
    """A7 with find_unused_parameters=True: torch's text ("this likely  means ...") naming b's indices."""
    for rank, result in enumerate(world2.run(rank_find_unused_error_text)):
        assert result["reference"] == result["torch"]
        assert "this likely  means that not all `forward` outputs" in result["reference"]
        assert f"for rank {rank}: 2 3" in result["reference"]


def test_marked_twice_error_text(world2):
    """A second backward through a parameter before the reduction finished: torch's "mark ... only once" text."""
    for result in world2.run(rank_marked_twice):
        assert result["reference"] == result["torch"]
        assert result["reference"].startswith("Expected to mark a variable ready only once.")


def test_different_models_error(world2):
    """A1: a parameter-count mismatch across ranks raises torch's "DDP expects same model across all ranks" text."""
    results = world2.run(rank_model_mismatch)
    for rank, result in enumerate(results):
        assert result["reference"] == result["torch"]
        assert result["reference"].startswith(f"DDP expects same model across all ranks, but Rank {rank} has")


def test_different_shapes_error_on_every_rank(world2):
    """A1: a shape mismatch raises on every rank: torch's text on the mismatching rank, the culprits named on the others."""
    results = world2.run(rank_shape_mismatch)
    assert results[1] == "[1]: params[0] in this process with sizes [3, 2] appears not to match sizes of the same " \
        "param in process 0."
    assert results[0].startswith("[0]: DDP expects same model across all ranks, but the parameters of rank(s) [1]")


def test_no_trainable_parameters_error(world2):
    """A module without a trainable parameter: torch's RuntimeError text."""
    for result in world2.run(rank_constructor_errors):
        assert result["reference"] == result["torch"] == ref_params.NO_TRAINABLE_PARAMETERS


# ---------------------------------------------------------------- static graph, shared accumulators, views, no_sync
def test_static_graph_unused_stays_unused(world2):
    """A8: b unused in iteration 1 keeps grad None in later iterations too (b never used)."""
    for result in world2.run(rank_static_graph, 99, 4):
        assert result["reference"][0] == result["torch"][0] == [None] * 4
        assert result["reference"][1] == result["torch"][1] == [None] * 4
        assert same_grads(result["reference"][2], result["torch"][2])


def test_static_graph_change_raises(world2):
    """A8: b unused in iteration 1 and used in iteration 2 raises torch's "training graph has changed" text."""
    for result in world2.run(rank_static_graph, 2, 3):
        errors_ref, errors_torch = result["reference"][0], result["torch"][0]
        assert errors_ref == errors_torch
        assert errors_ref[0] is None and errors_ref[1].startswith("Your training graph has changed")


@pytest.mark.parametrize("static_graph", [False, True])
def test_shared_accumulator(world2, static_graph):
    """D6: one bias in two modules, find_unused_parameters: 6 iterations run; 4 managed parameters; grads equal torch."""
    for result in world2.run(rank_shared_accumulator, static_graph):
        assert result["reference"][0] == 4
        assert same_grads(result["reference"][1], result["torch"][1])


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


def test_buffers_broadcast_from_rank_0(world2):
    """Rank 0's buffers on every rank at construction and before every forward."""
    results = world2.run(rank_buffers)
    for rank, result in enumerate(results):
        assert result["reference"] == result["torch"]
        # 7 from rank 0 at construction, + 1 from rank 0's first forward (broadcast), + this rank's own input
        assert result["reference"] == ([7.0] * 3, [7.0 + 1 + rank + 1] * 3)


def test_ignored_parameters(world2):
    """parameters_to_ignore: an ignored weight is neither broadcast nor in a bucket; others are reduced."""
    for result in world2.run(rank_ignored_parameters):
        assert result["reference"] == result["torch"] == (True, True, [0, 1, 2, 3, 4])


# ---------------------------------------------------------------- Join
@pytest.mark.parametrize("divide_by_initial", [False, True])
def test_join_divide_modes(world2, divide_by_initial):
    """D8: iterations {0: 3, 1: 5}: every entry 50 (active ranks) or 25 alone (initial world size); authoritative rank 1."""
    results = world2.run(rank_join, divide_by_initial, {0: 3, 1: 5})
    for result in results:
        assert result["reference"] == result["torch"]
    rank1 = [row[0] for row in results[1]["reference"][0]]
    assert rank1 == ([50.0] * 5 if not divide_by_initial else [50.0, 50.0, 50.0, 25.0, 25.0])
    assert [r["reference"][1] for r in results] == [1, 1]


def test_join_with_find_unused_and_comm_hook(world3):
    """Shadowing with find_unused_parameters and a comm hook, three ranks joining at different times: equal to torch."""
    for result in world3.run(rank_join, False, {0: 1, 1: 4, 2: 2}, True, True):
        assert result["reference"] == result["torch"]
        assert result["reference"][1] == 1


def test_join_throw_on_early_termination(world2):
    """D9: iterations {0: 2, 1: 3}: rank 0 "Rank 0 exhausted all inputs.", rank 1 "Detected at least one rank ..."."""
    results = world2.run(rank_join_throw, {0: 2, 1: 3})
    assert results[0]["reference"] == results[0]["torch"] == "Rank 0 exhausted all inputs."
    assert results[1]["reference"] == results[1]["torch"] == \
        "Detected at least one rank that exhausted inputs. Throwing across all ranks."


def test_join_with_another_joinable(world3):
    """torch's Join([ddp, other]): the other's hooks run as often as rank 2 trains alone; the last joiner is rank 2."""
    results = world3.run(rank_join_with_other_joinable)
    assert [r[0] for r in results] == [4, 2, 0]
    assert [r[1] for r in results] == [False, False, True]
    assert {r[2] for r in results} == {2}


# ---------------------------------------------------------------- other process groups
def test_reference_process_group(registry):
    """The reference DDP over the project's pure-Python `reference` process group meets D3."""
    world = _world(registry, "reference", 2)
    try:
        assert all(err < 1e-6 for err in world.run(rank_reference_backend_training))
    finally:
        world.close()


# ---------------------------------------------------------------- differential scenarios
def draw_scenario(rng: random.Random, world_size: int) -> dict:
    """A random training run: DDP options, comm hook, per-iteration no_sync/zero_grad and per-rank branch use.

    Only runs torch completes on every rank alike are drawn (an error on one
    rank only would leave the others in a collective): without unused-parameter
    search every rank uses the same branches; a static graph keeps its first
    iteration's use.
    """
    find_unused = rng.random() < 0.5
    static = rng.random() < 0.3

    def mask(per_rank):
        if per_rank:
            rows = [[rng.random() < 0.7 for _ in range(4)] for _ in range(world_size)]
        else:
            rows = [[rng.random() < 0.8 for _ in range(4)]] * world_size
        for row in rows:
            row[0] = True  # the loss always depends on some parameter
        return rows

    fixed = mask(per_rank=find_unused or static)
    if not find_unused and not static and rng.random() < 0.8:
        fixed = [[True] * 4] * world_size  # mostly runs that succeed; sometimes the A7 error path
    steps = []
    for _ in range(4):
        if find_unused and not static:
            use = mask(per_rank=True)
        else:
            use = fixed
        after_no_sync = bool(steps) and steps[-1]["no_sync"]
        # zero_grad(set_to_none) right after no_sync drops gradients the used-map still counts: torch raises
        # "Encountered gradient which is undefined" on the ranks concerned only, and the others hang
        steps.append({"mask": use, "no_sync": not static and rng.random() < 0.25,
                      "zero_grad": not after_no_sync and rng.random() < 0.6})
    never_finishes = not find_unused and not static and not all(all(row) for row in fixed)
    return {
        "find_unused_parameters": find_unused,
        "static_graph": static,
        # a reduction that never finishes leaves bucket-view gradients mid-all-reduce: undefined, not compared
        "gradient_as_bucket_view": not never_finishes and rng.random() < 0.4,
        "bucket_cap_mb": rng.choice([None, None, 0.0002, 0.001]),
        "hook": rng.choice([None, None, "allreduce", "fp16", "new_tensor"]),
        "double_branch": rng.random() < 0.3,
        "as_dict": rng.random() < 0.3,
        "steps": steps,
    }


@pytest.mark.parametrize("world_name", ["world2", "world3"])
def test_random_training_runs_equal_torch(request, world_name):
    """60 random runs per world size (options x comm hook x no_sync x per-rank unused branches): same grads or same error as torch."""
    world = request.getfixturevalue(world_name)
    rng = random.Random(20261121 + world.world_size)
    scenarios = [draw_scenario(rng, world.world_size) for _ in range(60)]
    results = world.run(rank_scenarios, scenarios, deadline=240)
    for rank, differences in enumerate(results):
        assert not differences, f"rank {rank}: " + "; ".join(
            f"scenario {n} {d} ({s})" for n, s, d in differences[:3])


def draw_join_scenario(rng: random.Random, world_size: int) -> dict:
    """Uneven inputs (0 to 5 iterations per rank) with Join: divide mode, unused search, hook, no_sync, buffers."""
    find_unused = rng.random() < 0.5
    # with find_unused_parameters a rank that joins before its first backward all-reduces torch's
    # uninitialised used-map (at::empty): not comparable, see test_join_before_first_iteration_find_unused
    iterations = [rng.randint(1 if find_unused else 0, 5) for _ in range(world_size)]
    steps = []
    for _ in range(max(iterations)):
        if find_unused:
            mask = [[True] + [rng.random() < 0.7 for _ in range(3)] for _ in range(world_size)]
        else:
            mask = [[True] * 4] * world_size
        after_no_sync = bool(steps) and steps[-1]["no_sync"]
        steps.append({"mask": mask, "no_sync": rng.random() < 0.2,
                      "zero_grad": not after_no_sync and rng.random() < 0.6})
    return {
        "iterations": iterations,
        "divide_by_initial": rng.random() < 0.5,
        "find_unused_parameters": find_unused,
        "gradient_as_bucket_view": rng.random() < 0.3,
        "bucket_cap_mb": rng.choice([None, 0.0002, 0.001]),
        "hook": rng.random() < 0.3,
        "steps": steps,
    }


@pytest.mark.parametrize("world_name", ["world2", "world3"])
def test_random_join_runs_equal_torch(request, world_name):
    """30 random uneven-input runs per world size under Join: same grads each iteration, same final model, same authoritative rank as torch."""
    world = request.getfixturevalue(world_name)
    rng = random.Random(77 + world.world_size)
    scenarios = [draw_join_scenario(rng, world.world_size) for _ in range(30)]
    results = world.run(rank_join_scenarios, scenarios, deadline=240)
    for rank, differences in enumerate(results):
        assert not differences, f"rank {rank}: " + "; ".join(
            f"scenario {n} {d} ({s})" for n, s, d in differences[:3])


def test_join_before_first_iteration_find_unused(world2):
    """A rank that joins before training adds zeros to the used-map all-reduce: unused parameters elsewhere keep grad None.

    torch 2.13 all-reduces its never-written used-map there (``at::empty`` in
    Reducer::initialize_local_used_map, garbage), so its active ranks may get
    zero gradients for parameters no rank used; the reference defines it.
    """
    results = world2.run(rank_join_before_first_iteration)
    assert results[0] == [False] * 4 + [True] * 3


@pytest.mark.parametrize("gradient_as_bucket_view", [False, True])
def test_parameter_layouts_are_kept(world2, gradient_as_bucket_view):
    """Bucket views take each parameter's strides (transposed, channels_last): gradients and their strides equal torch's."""
    for same, same_strides, transposed_strides in world2.run(rank_odd_layouts, gradient_as_bucket_view):
        assert same and same_strides
        assert transposed_strides == (1, 4)


@pytest.mark.parametrize("static_graph", [False, True])
def test_reentrant_checkpoint(world2, static_graph):
    """A layer used twice by reentrant checkpointing: the same gradients or errors as torch, per iteration.

    With a static graph its hook count (2) is learnt in iteration 1 and it is
    reduced at its last hook. Without, the engine runs the reducer's
    finalize callback at the end of the first reentrant backward already, so
    later hooks of that iteration are ignored: torch does exactly this too.
    """
    for difference, first_iteration_raised in world2.run(rank_reentrant_checkpoint, static_graph):
        assert difference is None
        assert not first_iteration_raised


def test_subgroup(world3):
    """Over a subgroup of global ranks [1, 2]: group ranks for sources and the authoritative rank, same results as torch."""
    results = world3.run(rank_subgroup_training)
    assert results[0] is None
    for difference, reference_authoritative, torch_authoritative in results[1:]:
        assert difference is None
        assert reference_authoritative == torch_authoritative == 1  # group rank of global rank 2, the last joiner
