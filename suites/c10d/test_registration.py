"""Contract: a backend is registered for the devices its ranks use, for those only, and each rank works on its own.

Every vendor reaches c10d through ``register_backend(name, creator, devices=[...])`` (Ascend's hccl for npu,
Cambricon's cncl for mlu, this project's native-dcdev for its PrivateUse1 test device dcdev: native/device/).
What torch 2.13 does with that registration, measured with native-dcdev on dcdev and gloo on cpu:

* ``get_default_backend_for_device(<type>)`` names the first backend registered for a device type torch
  ships no default for (``backend=None`` then picks it); a registration that leaves the device without one
  fails ``backend=None`` with 'Could not find the default backend type' (pytorch#189193, ``xpu:xccl``);
* ``new_group(device_id=torch.device("<type>:<index>"))`` binds the group to the device and works (gloo given a
  dcdev ``device_id`` instead fails: 'No backend type associated with device type dcdev');
* a backend serves the devices it was registered for only: a CPU tensor on a group whose backend was
  registered for dcdev alone fails with 'No backend type associated with device type cpu', and the CPU's
  default stays gloo;
* rank r works on its own device: ``torch.accelerator`` reports the index of the rank's device current, a
  tensor made on the bare device type lands there, and no two ranks share a device unless the spec says so.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from backends.mixed import is_qualified
from fixtures.devices import eager_init_refusal
from fixtures.rank import ctx
from suites.c10d.group_probes import error, summed, total
from suites.checks import expect_tensor

# torch 2.13 keeps a device's first default: a plugin registered for the cpu too (native) leaves it gloo
TORCH_DEFAULTS = {"cpu": "gloo"}


# ---------------------------------------------------------------- rank side
def default_backend() -> tuple[str, list[str]]:
    """(torch's default backend for this rank's device type, the backends registered for that type)."""
    device_type = torch.device(ctx.device).type
    registered = [name for name, devices in dist.Backend.backend_capability.items() if device_type in devices]
    return dist.get_default_backend_for_device(device_type), sorted(registered)


def bound_group() -> tuple[str, torch.Tensor]:
    """A group made with device_id=this rank's device: the device it is bound to, and an all_reduce over it."""
    group = dist.new_group(device_id=torch.device(ctx.device))
    try:
        return str(group.bound_device_id), summed(group)
    finally:
        dist.destroy_process_group(group)


def on_other_device(device_type: str) -> str:
    """How an all_reduce of a tensor on ``device_type`` on the default group ends ('' when it works)."""
    try:
        dist.all_reduce(torch.ones(2, device=device_type))
    except Exception as exc:  # the finding: torch refuses a device the backend was not registered for
        return error(exc)
    return ""


def my_device() -> tuple[int, str]:
    """(the index torch.accelerator reports current, where a tensor on the bare device type lands)."""
    device_type = torch.device(ctx.device).type
    return torch.accelerator.current_device_index(), str(torch.ones(1, device=device_type).device)


# ------------------------------------------------------------------ clauses
@pytest.fixture
def plain_backend(backend_spec) -> None:
    """Skip a mixed string's world: its registration is each part's, held by that part's own run."""
    if is_qualified(backend_spec.name):
        pytest.skip(f"{backend_spec.name} is a mixed string: each part's registration is checked on its own")


@pytest.fixture
def accelerator(backend_spec) -> None:
    if backend_spec.device_type == "cpu":
        pytest.skip(f"{backend_spec.name}'s ranks are on the cpu: there is no device index to bind")


def test_default_backend_of_the_device_is_a_registered_one(world, backend_spec, plain_backend):
    """The device's default backend is torch's own, or the one registered for it (the spec's, if alone)."""
    device_type = backend_spec.device_type
    for rank, (default, registered) in enumerate(world.run(default_backend)):
        assert backend_spec.init_backend in registered, \
            f"rank {rank}: {backend_spec.init_backend} is not registered for {device_type} (only {registered})"
        if device_type in TORCH_DEFAULTS:
            assert default == TORCH_DEFAULTS[device_type], \
                f"rank {rank}: registering a backend replaced torch's default for {device_type} by {default}"
        else:
            assert default in registered, f"rank {rank}: {device_type}'s default {default} is not registered for it"
            if registered == [backend_spec.init_backend]:
                assert default == backend_spec.init_backend, f"rank {rank}: {device_type}'s default is {default}"


def test_group_made_with_device_id_is_bound_to_it(world, backend_spec, plain_backend):
    """new_group(device_id=<the rank's device>) binds the group to that device, and its collectives work."""
    refusal = eager_init_refusal(backend_spec.device_type)
    if refusal:
        pytest.skip(refusal)
    for rank, (bound, value) in enumerate(world.run(bound_group)):
        assert bound == world.devices[rank], f"rank {rank}: the group is bound to {bound}, not {world.devices[rank]}"
        expect_tensor(value, total(range(world.world_size)), f"all_reduce over the bound group on rank {rank}")


def test_backend_does_not_take_over_another_device(world, backend_spec, plain_backend):
    """A tensor on a device the backend was not registered for is refused by torch, never served."""
    capability = dist.Backend.backend_capability.get(backend_spec.init_backend, [])
    others = [d for d in ("cpu", backend_spec.device_type) if d not in capability]
    if not others:
        pytest.skip(f"{backend_spec.init_backend} is registered for every device type its world can use "
                    f"({', '.join(capability)})")
    for device_type in others:
        for rank, outcome in enumerate(world.run(on_other_device, device_type)):
            assert outcome == f"RuntimeError: No backend type associated with device type {device_type}", \
                f"rank {rank}: an all_reduce on {device_type} ended with {outcome or 'success'}"


def test_each_rank_works_on_its_own_device(world, backend_spec, accelerator):
    """torch.accelerator reports each rank's own device index current, and the ranks' devices are distinct."""
    for rank, (index, lands_on) in enumerate(world.run(my_device)):
        expected = world.devices[rank]
        assert (index, lands_on) == (torch.device(expected).index, expected), \
            f"rank {rank} should work on {expected}: current index {index}, a new tensor lands on {lands_on}"
    if not backend_spec.shares_devices:
        assert len(set(world.devices)) == world.world_size, f"ranks share devices: {world.devices}"
