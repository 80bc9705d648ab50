"""Registering the native backend for the dcdev device (native/device/) with a seeded bug planted.

The device extension holds every planted bug of the staging backend (staged.cpp, PlantedBug); a bug module
registers it under its own name with one of them, planted for the rank process when its group is made.
Importing one registers the dcdev device in every process of the run (torch.accelerator then reports it), so
these bugs never share a run with other backends.
"""

from __future__ import annotations

import native.device


def register_dcdev_bug(name: str, planted_bug: str, summary: str):
    """Register native-dcdev with ``planted_bug`` under backend ``name``; return its spec."""
    return native.device.register(name, planted_bug, description=f"native-dcdev with a seeded bug: {summary}")
