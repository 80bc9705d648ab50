"""The reference DistributedOptimizer's own logic on the reference agents, with a TEST SHIM for autograd.

The contract clauses (suites/dist_autograd/test_optimizer.py) need real
distributed autograd. These checks drive backends/reference/rpc/optim.py
with ``ShimDistAutograd`` (tests/rpc_cases/optim_shim_fns.py: gradients filed
per context by each owner's local autograd, nothing more), so the
optimizer's grouping by owner, its two paths, the caller-side context check
and its error propagation are checked on reference-tp whether or not the
reference autograd exists. The shim never ships.
"""

from __future__ import annotations

import pytest
import torch

from backends.registry import BackendRegistry
from fixtures.pool import WorldPool
from tests.rpc_cases import optim_shim_fns as fns

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def world3():
    pool = WorldPool(BackendRegistry(), deadline=60.0, max_alive=1)
    yield pool.get("gloo", 3)
    pool.close_all()


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "PlainSGD", "PlainAdam"])
def test_reference_optimizer_equals_local_with_shim_gradients(world3, optimizer):
    """Owners step with the context's gradients: same weights as local training; .grad per path; errors come back."""
    for rank, out in enumerate(world3.run(fns.train, optimizer, 3, f"shim-{optimizer}")):
        for got, want in zip(out["got"], out["want"]):
            torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank}, {optimizer}: {m}")
        functional = optimizer in ("SGD", "Adam")
        assert out["functional"] == functional
        if functional:
            assert out["grads"] == [None, None], f"rank {rank}: the functional path set .grad"
        else:
            assert all(g is not None for g in out["grads"]), f"rank {rank}: the non-functional path left .grad unset"
        assert out["unknown"] == ("RuntimeError", "Could not find autograd context with id: 12345")
        assert out["step_error"][0] == "ValueError" and "Error running optimizer." in out["step_error"][1]
        assert out["ctor_error"][0] == "ValueError" and "Error creating optimizer." in out["ctor_error"][1]
