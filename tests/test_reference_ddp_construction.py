"""What the reference DDP checks and syncs when it is built, against torch 2.13's DDP.

Models that differ between ranks and modules without a trainable parameter
raise torch's error texts; buffers come from rank 0 at construction and before
every forward; parameters_to_ignore are neither broadcast nor reduced
(/work/shared/specs/ddp-join-rpc-profiling.md, part D).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from backends.reference.ddp import params as ref_params
from fixtures.rank import ctx
from tests.reference_cases.ddp_common import IMPLS, Small, bucket_layout, ddp_class, error_text, wrap
from tests.reference_cases.ddp_common import registry, world2  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.timeout(300)


# ================================================================ rank side
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
