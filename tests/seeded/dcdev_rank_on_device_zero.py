"""Seeded bug in the harness's device binding: every rank binds device index 0, whatever its local rank.

The rank-to-device mapping (fixtures/devices.py) is replaced in each rank by one that makes ``<type>:0``
current (seed 000: PyTorch #47797, a rank that created its context on GPU 0 for lack of set_device). Tensors
made on the bare device type then land on device 0 for every rank:
suites/c10d/test_registration.py::test_each_rank_works_on_its_own_device.
"""

import torch

import fixtures.devices
from tests.seeded.dcdev_base import register_dcdev_bug

_bind = fixtures.devices.bind_rank_to_device


def _bind_device_zero(device: str):
    if device == "cpu":
        return _bind(device)
    return _bind(f"{torch.device(device).type}:0")


fixtures.devices.bind_rank_to_device = _bind_device_zero
DISTCONFORM_SPEC = register_dcdev_bug("dcdev_rank_on_device_zero", "none", "every rank bound to device 0")
