"""The reference DDP on models that leave parameters unused or use them twice, against torch 2.13's DDP.

Which parameters DDP manages (shared ones once, ignored and frozen ones not),
rank-dependent control flow, unused parameters with and without
find_unused_parameters, static graphs, one bias shared by two modules and a
layer run twice by reentrant checkpointing: the same gradients as torch and,
where torch raises, its exact error text (/work/shared/specs/ddp-join-rpc-profiling.md, part D).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from backends.reference.ddp import params as ref_params
from fixtures.rank import ctx
from tests.reference_cases.ddp_common import IMPLS, describe_difference, error_text, grads, same_grads, wrap
from tests.reference_cases.ddp_common import registry, world2  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.timeout(300)


# ================================================================ rank side
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


# ================================================================ pytest side
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


# ---------------------------------------------------------------- static graph, shared accumulators, checkpoints
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
