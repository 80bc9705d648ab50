"""Contract: wrapping a module that DDP cannot train is a clear error on every rank.

* A module without a parameter that requires a gradient: RuntimeError
  "DistributedDataParallel is not needed when a module doesn't have any
  parameter that requires a gradient." (spec A1), before any communication.
* Ranks wrapping models with different parameter counts: every rank raises
  "DDP expects same model across all ranks" instead of hanging or training
  silently wrong (A1).
* Construction broadcasts rank 0's parameters and buffers: replicas built
  with different weights start equal (A1).
"""

import pytest
import torch
import torch.nn as nn

from fixtures.rank import ctx
from suites.ddp import impls, models

pytestmark = pytest.mark.needs(feature="ddp")

NOT_NEEDED = ("DistributedDataParallel is not needed when a module doesn't have any parameter that requires a "
              "gradient.")
NOT_SAME_MODEL = "DDP expects same model across all ranks"


# ---------------------------------------------------------------- rank side
def construction_error(impl, case):
    if case == "frozen":
        module = nn.Linear(3, 3).requires_grad_(False)
    else:  # rank 0 has one layer more than the others
        module = nn.Sequential(*[nn.Linear(3, 3) for _ in range(2 if ctx.rank == 0 else 1)])
    try:
        impls.wrap(impl, module)
    except Exception as exc:  # noqa: BLE001 - type and text are the finding
        return type(exc).__name__, str(exc)
    return None, "no error"


def replicas_after_construction(impl):
    model = models.CountingLinear(weight=1.0 + ctx.rank)
    model.forwards.fill_(10 + ctx.rank)
    ddp = impls.wrap(impl, model)
    return ddp.module.lin.weight.detach().cpu().clone(), ddp.module.forwards.item()


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("impl", impls.impl_params())
def test_no_trainable_parameter_is_an_error(world, impl):
    """A module whose parameters all have requires_grad=False: every rank raises "DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient."."""
    for rank, (kind, message) in enumerate(world.run(construction_error, impl, "frozen")):
        assert (kind, message) == ("RuntimeError", NOT_NEEDED), f"{impl} DDP rank {rank}: {kind}: {message!r}"


@pytest.mark.min_world_size(2)  # models differ between ranks
@pytest.mark.parametrize("impl", impls.impl_params())
def test_different_models_are_an_error_on_every_rank(world, impl):
    """Rank 0 wraps two layers, the others one: every rank raises an error starting "DDP expects same model across all ranks"."""
    for rank, (kind, message) in enumerate(world.run(construction_error, impl, "mismatch")):
        assert kind is not None and message.startswith(NOT_SAME_MODEL), \
            f"{impl} DDP rank {rank}: {kind}: {message!r}"


@pytest.mark.parametrize("impl", impls.impl_params())
def test_construction_broadcasts_rank0_state(world, impl):
    """Construction copies rank 0's parameters and buffers to every rank."""
    for rank, (weight, forwards) in enumerate(world.run(replicas_after_construction, impl)):
        assert torch.equal(weight, torch.ones(5, 5)), f"{impl} DDP rank {rank}: weight {weight[0].tolist()}..., expected rank 0's ones"
        assert forwards == 10.0, f"{impl} DDP rank {rank}: buffer {forwards}, expected rank 0's 10"
