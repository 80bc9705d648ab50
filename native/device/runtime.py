"""dcdev's Python side: PrivateUse1 renamed to ``dcdev`` and ``torch.dcdev``, the device module torch looks up.

``register()`` loads the extension (native/device/device.cpp: allocator, device guard, hooks, kernels), renames
PrivateUse1 and registers the module below, once per process; forked children inherit it.
"""

from __future__ import annotations

import contextlib
import types

DEVICE = "dcdev"


def _device(device) -> "object":
    import torch

    return torch.device(DEVICE, torch.accelerator.current_device_index() if device is None else _index(device))


def _module(extension) -> types.ModuleType:
    """``torch.dcdev``: what torch's device-generic code (torch.accelerator, Tensor.dcdev(), .to()) calls."""
    import torch

    module = types.ModuleType(f"torch.{DEVICE}", "distconform's PrivateUse1 test device (native/device/)")
    module.is_available = lambda: True
    module.is_initialized = lambda: True
    module._is_in_bad_fork = lambda: False
    module.device_count = extension.device_count
    module.current_device = extension.current_device
    module.set_device = lambda index: extension.set_device(_index(index))
    module.synchronize = lambda device=None: None  # kernels are synchronous
    module.manual_seed_all = lambda seed: None  # random factories run on the CPU fallback's generator
    # streams and events (FSDP2 asks the device module for them): one stream per device, kernels synchronous
    module.Stream = lambda device=None, priority=0, **kwargs: torch.Stream(device=_device(device), priority=priority)
    module.Event = lambda enable_timing=False, **kwargs: torch.Event(device=_device(None), enable_timing=enable_timing)
    module.current_stream = lambda device=None: torch.accelerator.current_stream(_device(device))
    module.default_stream = module.current_stream
    module.set_stream = torch.accelerator.set_stream
    module.stream = lambda stream: contextlib.nullcontext() if stream is None else stream
    module.kernels_run = extension.kernels_run
    module.live_bytes = extension.live_bytes
    return module


def _index(device) -> int:
    import torch

    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != DEVICE:
        raise ValueError(f"torch.{DEVICE}.set_device: {device} is not a {DEVICE} device")
    return 0 if device.index is None else device.index


def register() -> types.ModuleType:
    """Make ``dcdev`` a device of this process (idempotent); return torch.dcdev."""
    import torch

    from . import build

    extension = build.load()
    if torch._C._get_privateuse1_backend_name() != DEVICE:
        torch.utils.rename_privateuse1_backend(DEVICE)
    if not hasattr(torch, DEVICE):
        torch._register_device_module(DEVICE, _module(extension))
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    return getattr(torch, DEVICE)
