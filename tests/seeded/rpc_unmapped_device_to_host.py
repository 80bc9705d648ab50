"""Seeded bug: the reference sender moves a device tensor to the host when its destination has no device map.

Without a map for the destination an accelerator tensor must be refused with an error naming its device (TensorPipe:
"TensorPipe RPC backend only supports CPU tensors by default ... but found tensor on device: cuda:0"); this sender
copies it to the host and sends it on, so the callee silently gets a CPU tensor (a plausible "helpful" fallback).
Caught by suites/rpc/test_device_maps.py::test_unmapped_destination_refuses_accelerator_tensors. Its ranks are on
dcdev (native-dcdev, no planted backend bug), so it registers the device in every process of its run.
"""

from backends.reference.rpc import device_maps
from tests.seeded.dcdev_base import register_dcdev_bug
from tests.seeded.planting import plant


def _to_the_host(original):
    def placement(mapping, destination, what):
        place = original(mapping, destination, what)
        if mapping is not None:
            return place

        def to_the_host(tensor):
            return None  # BUG: an unmapped device tensor travels as a CPU tensor instead of being refused
        return to_the_host
    return placement


DISTCONFORM_SPEC = register_dcdev_bug("rpc_unmapped_device_to_host", "none",
                                      "reference RPC senders move unmapped device tensors to the host")
plant("rpc_unmapped_device_to_host", device_maps, "placement", _to_the_host)
