"""Seeded bug: the reference RemoteModule ignores the device of its remote device string.

"worker1/cuda:0" builds the module on worker1's CPU (``device`` says "cpu"),
so a user who asked for a GPU silently trains on the CPU. Caught by the
remote-device clause: 'w/cuda:0' must keep device cuda:0 (and fail at first
use on a CPU build).
"""

from backends.reference.rpc import nn as reference_nn
from tests.seeded.training_base import plant


def _ignore_device(original):
    def _prepare_init(self, remote_device):
        original(self, remote_device)
        self.device = "cpu"  # BUG: whatever device was asked for
    return _prepare_init


DISTCONFORM_SPEC = plant("remote_module_ignores_device", reference_nn.RemoteModule, "_prepare_init", _ignore_device)
