"""What the reference DDP's tests (tests/test_reference_ddp_*.py) share: both DDPs, models, comparisons, worlds.

Every case builds the same model under the reference DDP
(backends/reference/ddp/) and under ``torch.nn.parallel.DistributedDataParallel``
(``IMPLS``, ``wrap``) and compares what they produce (``grads``,
``same_grads``, ``describe_difference``, ``error_text``, ``bucket_layout``).
The persistent gloo worlds of 2 and 3 ranks are shared by every such module (started once, closed when
pytest ends): a test module takes them by importing ``registry``, ``world2`` and ``world3``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

IMPLS = ("reference", "torch")


# ================================================================ rank side
def ddp_class(impl):
    if impl == "reference":
        from backends.reference.ddp import DistributedDataParallel

        return DistributedDataParallel
    return nn.parallel.DistributedDataParallel


def wrap(impl, module, **options):
    return ddp_class(impl)(module, **options)


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


# ================================================================ worlds
@pytest.fixture(scope="module")
def registry():
    from backends.registry import BackendRegistry

    return BackendRegistry()


def start_world(registry, backend, size):
    """A started World of ``size`` ranks of ``backend``, every rank on the CPU."""
    from fixtures.world import World

    return World(registry.get(backend), size, ("cpu",) * size).start()


# One world per size for every tests/test_reference_ddp_*.py module, as when they were one file (a world
# per module starts 5 gloo worlds instead of 2). Closed when pytest ends.
_WORLDS: dict[int, object] = {}


def _shared_world(request, registry, size: int):
    if size not in _WORLDS:
        _WORLDS[size] = world = start_world(registry, "gloo", size)
        request.config.add_cleanup(world.close)
        request.config.add_cleanup(lambda: _WORLDS.pop(size, None))
    return _WORLDS[size]


@pytest.fixture(scope="module")
def world2(request, registry):
    return _shared_world(request, registry, 2)


@pytest.fixture(scope="module")
def world3(request, registry):
    return _shared_world(request, registry, 3)
