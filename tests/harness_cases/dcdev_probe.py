"""What tests/test_dcdev.py asks of the dcdev device, run in a process of its own (registering a PrivateUse1
device is for the whole process): ``python -m tests.harness_cases.dcdev_probe facts|host_read``."""

from __future__ import annotations

import ctypes
import json
import sys


def facts() -> dict:
    import torch

    from native.device import runtime

    runtime.register()
    torch.accelerator.set_device_index(3)
    t = torch.arange(6, dtype=torch.float32, device="dcdev:2")
    grid = torch.zeros(3, 4, device="dcdev:1")
    grid.fill_(5)
    column = grid[:, 1]
    moved = grid.to("dcdev:4")
    return {
        "accelerator": str(torch.accelerator.current_accelerator()),
        "available": torch.accelerator.is_available(),
        "count": torch.accelerator.device_count(),
        "current": torch.accelerator.current_device_index(),
        "default_placement": str(torch.ones(2, device="dcdev").device),
        "round_trip": t.cpu().tolist(),
        "fallback": (t * 2 + 1).cpu().tolist(),
        "fallback_device": str((t * 2).device),
        "column": column.cpu().tolist(),
        "column_is_view": column.untyped_storage().data_ptr() == grid.untyped_storage().data_ptr(),
        "device_to_device": [str(moved.device), moved.cpu().sum().item()],
        "item": grid.sum().item(),
        "empty": torch.empty(0, device="dcdev").cpu().tolist(),
    }


def host_read() -> None:
    """Reads a device tensor's bytes from the host, as a backend handing data_ptr() to memcpy would."""
    import torch

    from native.device import runtime

    runtime.register()
    t = torch.ones(4, device="dcdev:0")
    print("read", ctypes.string_at(t.data_ptr(), 4), flush=True)  # faults: the mapping is PROT_NONE


if __name__ == "__main__":
    if sys.argv[1] == "facts":
        print(json.dumps(facts()))
    else:
        host_read()
