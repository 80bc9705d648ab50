"""Contract: bitwise determinism.

Floating-point reductions depend on the order a backend combines ranks in, so
the closed-form clauses use exact inputs; here inputs are ordinary random
floats and the promise is different: the same all_reduce on the same inputs,
repeated in the same world and again in a freshly started world, gives the
same bits, and the same bits on every rank (a replicated model otherwise
drifts apart). An FSDP2 training step repeated from the same start gives
bit-identical parameters. A backend that does not promise this declares a gap
(feature "bitwise_determinism").
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.parallel import training

pytestmark = pytest.mark.needs(feature="bitwise_determinism")

REPEATS = 4
# small (one message) and 1 MiB (gloo switches to its chunked ring algorithm)
SIZES = [pytest.param(1000, id="1000"), pytest.param(1 << 18, id="1MiB")]


def random_input(rank: int, numel: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(numel, generator=gen, dtype=torch.float32) * (10.0 ** (rank % 3))


# ---------------------------------------------------------------- rank side
def repeated_all_reduce(numel: int, repeats: int) -> list[torch.Tensor]:
    out = []
    for _ in range(repeats):
        t = random_input(ctx.rank, numel).to(ctx.device)
        dist.all_reduce(t)
        out.append(t.cpu().view(torch.int32))  # bits, so the comparison below is bitwise
    return out


def repeated_fsdp_step(repeats: int):
    return [training.train_fsdp(2)[1] for _ in range(repeats)]


def _bits(params: dict) -> dict:
    return {name: p.view(torch.int32) for name, p in params.items()}


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    i = int((a != b).reshape(-1).nonzero()[0])
    fa, fb = a.view(torch.float32).reshape(-1)[i].item(), b.view(torch.float32).reshape(-1)[i].item()
    return f"{int((a != b).sum())} of {a.numel()} elements differ; first at {i}: {fa!r} vs {fb!r}"


# ------------------------------------------------------------------ clauses
@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("numel", SIZES)
def test_all_reduce_bitwise_repeatable(world, numel):
    """all_reduce of random floats, repeated, gives identical bits every time and on every rank."""
    results = world.run(repeated_all_reduce, numel, REPEATS)
    reference = results[0][0]
    for rank, runs in enumerate(results):
        for i, bits in enumerate(runs):
            assert torch.equal(bits, reference), \
                f"all_reduce repeat {i} on rank {rank} differs from repeat 0 on rank 0: {_first_difference(bits, reference)}"


@pytest.mark.needs(collective="all_reduce")
def test_all_reduce_bitwise_fresh_world(world, world_pool):
    """all_reduce of random floats in a freshly started world gives the bits it gave before, on every rank."""
    numel = 1 << 18
    before = world.run(repeated_all_reduce, numel, 1)
    fresh = world_pool.replace(world)  # new rank processes, new process group, new connections
    after = fresh.run(repeated_all_reduce, numel, 1)
    for rank, ((old,), (new,)) in enumerate(zip(before, after)):
        assert torch.equal(new, before[0][0]), \
            f"rank {rank} in a fresh world: {_first_difference(new, before[0][0])}"
        assert torch.equal(old, before[0][0]), f"rank {rank} vs rank 0 before: {_first_difference(old, before[0][0])}"


@pytest.mark.needs(form="fsdp")
def test_fsdp2_step_bitwise_repeatable(world):
    """FSDP2 training repeated from the same initial model gives bit-identical parameters, on every rank."""
    results = world.run(repeated_fsdp_step, 2)
    first = _bits(results[0][0])
    for rank, runs in enumerate(results):
        for i, params in enumerate(runs):
            for name, bits in _bits(params).items():
                assert torch.equal(bits, first[name]), \
                    f"FSDP2 run {i} on rank {rank}: parameter {name}: {_first_difference(bits, first[name])}"
