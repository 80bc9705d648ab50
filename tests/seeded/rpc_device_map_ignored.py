"""Seeded bug: the reference receiver ignores the sender's device map and delivers device tensors on the host.

A tensor on dcdev:0 sent to worker1 with the map {dcdev:0: dcdev:1} must arrive on dcdev:1; this receiver keeps
the host copy the bytes arrived in (a plausible slip: the map consulted on the sender only, the tensor's bytes
landing wherever the frame was read). Values are exact, so only a clause that asks where the tensor landed sees it:
suites/rpc/test_device_maps.py::test_tensor_crosses_onto_the_mapped_device_and_back. Its ranks are on dcdev
(native-dcdev, no planted backend bug), so it registers the device in every process of its run.
"""

from backends.reference.rpc import serialize
from tests.seeded.dcdev_base import register_dcdev_bug
from tests.seeded.planting import plant


def _on_the_host(original):
    def placed_tensor_receiver(index, device):
        return serialize._tables.recv[index]  # BUG: the host copy, wherever the sender's map said it lands
    return placed_tensor_receiver


DISTCONFORM_SPEC = register_dcdev_bug("rpc_device_map_ignored", "none",
                                      "reference RPC receivers deliver mapped device tensors on the host")
plant("rpc_device_map_ignored", serialize, "_placed_tensor_receiver", _on_the_host)
