"""Contract: in a mixed backend string each device is served by the backend the string names for it.

``init_process_group("cpu:<backend>,cuda:gloo")`` gives the default group one backend per device: the
backend under test for CPU tensors, gloo for CUDA tensors (``group._get_backend(device)``), and the group is
torch's ``ProcessGroup`` holding them, so CPU collectives reach the backend under test and CUDA ones gloo.
What torch offers a backend written in Python decides whether it can: measured on torch 2.14.1
(suites/c10d/fault_tolerance_measure.py mixed_string), a ``torch._C._distributed_c10d.Backend`` subclass
(constructible from 2.14 on; the reference takes that form then, backends/reference/backend_form.py) is routed
per device ('cpu:mine,cuda:gloo': Mine for cpu, ProcessGroupGloo for cuda), while a Python ``ProcessGroup`` (the
reference before 2.14, the seeded gloo wrapper) becomes the group itself and the string's other parts are dropped
(a gap of those backends). No CUDA tensor is needed: the clause reads which backend serves each device, by its
``Backend.name()`` (cpu's must be the one serving it when the backend is named alone), and reduces on CPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx, reinit_process_group
from suites.c10d.fault_tolerance import error

pytestmark = pytest.mark.needs(collective="all_reduce", feature="mixed_string")


# ---------------------------------------------------------------- rank side
def routed_per_device() -> dict:
    """The default group made again with 'cpu:<backend>,cuda:gloo': who serves each device, a CPU all_reduce."""
    spec = ctx.spec
    alone = _served_by(torch.device("cpu"))  # the default group of the backend alone: who serves CPU tensors
    ctx.spec = dataclasses.replace(spec, torch_backend=f"cpu:{spec.init_backend},cuda:gloo")
    try:
        reinit_process_group(f"routing-{ctx.case_id}")
    finally:
        ctx.spec = spec
    try:
        found: dict = {"group": type(dist.group.WORLD).__name__, "alone": alone}
        for device in ("cpu", "cuda"):
            found[device] = _served_by(torch.device(device))
        tensor = torch.full((2,), ctx.rank + 1.0)
        dist.all_reduce(tensor)
        found["sum"] = tensor[0].item()
        return found
    finally:
        reinit_process_group(f"routing-{ctx.case_id}-restored")


def _served_by(device: torch.device) -> tuple[str, str]:
    """The default group's backend for ``device``: (its name, Backend.name(); its Python type), or (the error, "")."""
    try:
        backend = dist.group.WORLD._get_backend(device)
        return backend.name(), type(backend).__name__
    except Exception as exc:
        return error(exc), ""


# ------------------------------------------------------------------ clauses
def test_each_device_gets_the_backend_the_string_names(world, backend_spec):
    """'cpu:<backend>,cuda:gloo': gloo serves cuda, the backend under test cpu; a CPU all_reduce is exact."""
    if backend_spec.device_type != "cpu" or ":" in backend_spec.init_backend:
        pytest.skip(f"{backend_spec.name} is not a CPU backend named alone: the clause builds 'cpu:<it>,cuda:gloo'")
    n = world.world_size
    for rank, found in enumerate(world.run(routed_per_device)):
        assert found["cuda"] == ("gloo", "ProcessGroupGloo"), \
            f"rank {rank}: cuda is served by {found['cuda']} (group {found['group']}), not the string's gloo"
        assert found["cpu"][0] == found["alone"][0], \
            f"rank {rank}: cpu is served by {found['cpu']}, not by the backend the string names for it " \
            f"({found['alone']} when named alone)"
        assert found["sum"] == n * (n + 1) / 2, f"rank {rank}: CPU all_reduce gave {found['sum']}"
