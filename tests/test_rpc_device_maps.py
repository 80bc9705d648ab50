"""The reference agents' device maps, without a device: options checked as TensorPipe's, the world checked at start,
where a message's tensors land.

What a map does to tensors on a device is the contract's (suites/rpc/test_device_maps.py, run on the dcdev test
device: docs/rpc.md); here the parts that need none, with devices of a type torch knows and this process lacks (xpu): bad options refused with an error naming the problem
(backends/reference/rpc/device_maps.py, options.py), a world whose maps name a device a worker lacks refused by
every worker's init, and the placement rule (a CPU tensor stays, an unmapped device tensor is refused naming its
device and the destination, a mapped one lands where the map says).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from backends.reference.rpc import ReferenceRpcBackendOptions, device_maps
from backends.reference.rpc.agent import Agent
from backends.reference.rpc.tp_transport import TpTransport

START_JOIN_S = 15.0


def options(**kwargs) -> ReferenceRpcBackendOptions:
    return ReferenceRpcBackendOptions(store=dist.HashStore(), **kwargs)


def test_options_read_back_as_devices():
    """Maps and devices are stored as torch.devices, as TensorPipeRpcBackendOptions gives them back."""
    got = options(device_maps={"worker1": {"xpu:0": "xpu:1", "cpu": "cpu"}}, devices=["xpu:0"])
    assert got.device_maps == {"worker1": {torch.device("xpu:0"): torch.device("xpu:1"),
                                           torch.device("cpu"): torch.device("cpu")}}
    assert got.devices == [torch.device("xpu:0")]
    got.set_device_map("worker2", {"xpu:0": "xpu:2"})
    assert got.device_maps["worker2"] == {torch.device("xpu:0"): torch.device("xpu:2")}


@pytest.mark.parametrize("kwargs, error, text", [
    ({"device_maps": {"worker1": {"xpu:0": "xpu:1", "xpu:2": "xpu:1"}}}, ValueError,
     r"device_maps\['worker1'\] only supports 1-to-1 mapping, trying to map xpu:0 and xpu:2 to xpu:1"),
    ({"device_maps": {"worker1": {"nodevice:0": "cpu"}}}, ValueError,
     r"device_maps\['worker1'\]: 'nodevice:0' is not a device: .*nodevice"),
    ({"device_maps": {"worker1": {"xpu": "xpu:1"}}}, ValueError,
     r"device_maps\['worker1'\]: xpu names no device index; device maps need one device, e.g. 'xpu:0'"),
    ({"device_maps": {"worker1": {"xpu:0": 1.5}}}, TypeError,
     r"device_maps\['worker1'\]\['xpu:0'\]: expected a device .* got float 1.5"),
    ({"device_maps": {1: {"xpu:0": "xpu:1"}}}, TypeError, r"device_maps: keys are worker names \(str\), got int 1"),
    ({"device_maps": {"worker1": ["xpu:0"]}}, TypeError, r"device_maps\['worker1'\]: expected a dict"),
    ({"devices": ["xpu:0", "xpu:0"]}, ValueError, r"devices lists xpu:0 twice"),
    ({"devices": "xpu:0"}, TypeError, r"devices: expected a list of devices, got str"),
    ({"device_maps": {"worker1": {"xpu:1": "xpu:0"}}, "devices": ["xpu:0"]}, ValueError,
     r"device_maps\['worker1'\] maps xpu:1, which devices \['xpu:0'\] does not list"),
])
def test_bad_options_are_refused_naming_the_problem(kwargs, error, text):
    """A bad device, a map that is not one-to-one, a map source outside ``devices``: refused when the options are made."""
    with pytest.raises(error, match=text):
        options(**kwargs)


def test_set_device_map_keeps_a_map_one_to_one():
    """set_device_map refuses to remap a device (TensorPipe's text) and to map two devices to one."""
    got = options(device_maps={"worker1": {"xpu:0": "xpu:1"}})
    with pytest.raises(ValueError, match=r"`set_device_map` only supports 1-to-1 mapping, trying to map xpu:0 to "
                                         r"xpu:2 and xpu:1"):
        got.set_device_map("worker1", {"xpu:0": "xpu:2"})
    with pytest.raises(ValueError, match="only supports 1-to-1 mapping"):
        got.set_device_map("worker1", {"xpu:3": "xpu:1"})
    assert got.device_maps == {"worker1": {torch.device("xpu:0"): torch.device("xpu:1")}}


def advertised(name: str, maps=None, devices=(), accelerator=None, count=0) -> device_maps.Advertised:
    return device_maps.Advertised(name, accelerator, count, tuple(devices), maps or {})


@pytest.mark.parametrize("workers, text", [
    ([advertised("worker0", {"worker9": {"cpu": "cpu"}}), advertised("worker1")],
     r"worker0 has device maps for worker9, which are not workers of this world \(worker0, worker1\)"),
    ([advertised("worker0", {"worker1": {"xpu:0": "xpu:1"}}), advertised("worker1", accelerator="xpu", count=8)],
     r"worker0's device map for worker1 maps xpu:0, which worker0 does not have \(it has no accelerator\)"),
    ([advertised("worker0", {"worker1": {"xpu:0": "xpu:8"}}, accelerator="xpu", count=8),
      advertised("worker1", accelerator="xpu", count=8)],
     r"worker0's device map for worker1 maps xpu:0 to xpu:8, which worker1 does not have \(it has 8 xpu "
     r"devices\)"),
    ([advertised("worker0", {"worker1": {"xpu:0": "xpu:2"}}, accelerator="xpu", count=8),
      advertised("worker1", devices=["xpu:1"], accelerator="xpu", count=8)],
     r"worker0's device map for worker1 maps xpu:0 to xpu:2, which worker1's devices \['xpu:1'\] do not list"),
    ([advertised("worker0", devices=["xpu:0"]), advertised("worker1")],
     r"worker0's devices name xpu:0, which worker0 does not have \(it has no accelerator\)"),
])
def test_the_world_is_checked_at_start(workers, text):
    """Every worker's maps against every worker's devices, as TensorPipe's _validate_device_maps."""
    with pytest.raises(ValueError, match=text):
        device_maps.check_world(workers)


def test_replies_use_the_inverse_of_the_callers_map():
    """worker1 replies to worker0 with the inverse of worker0's map to worker1; to a worker without a map, none."""
    workers = [advertised("worker0", {"worker1": {"xpu:0": "xpu:1"}}), advertised("worker1"), advertised("worker2")]
    assert device_maps.reverse_maps("worker1", workers) == {"worker0": {torch.device("xpu:1"): torch.device("xpu:0")}}
    assert device_maps.reverse_maps("worker2", workers) == {}


def on(device: str) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device(device))  # all placement reads of a tensor


def test_placement_of_one_message():
    """CPU tensors stay; a device tensor lands where the map says, or is refused naming its device and destination."""
    mapped = device_maps.placement({torch.device("xpu:0"): torch.device("xpu:1")}, "worker1", "request")
    assert mapped(on("cpu")) is None
    assert mapped(on("xpu:0")) == torch.device("xpu:1")
    with pytest.raises(RuntimeError, match=r"the request to worker1 holds a tensor on device xpu:2, and the device "
                                           r"map for worker1 \(\{'xpu:0': 'xpu:1'\}\) does not name device xpu:2"):
        mapped(on("xpu:2"))
    unmapped = device_maps.placement(None, "worker0", "response")
    assert unmapped(on("cpu")) is None
    with pytest.raises(RuntimeError, match=r"the response to worker0 holds a tensor on device xpu:1, and worker0 "
                                           r"has no device map for this worker"):
        unmapped(on("xpu:1"))
    to_cpu = device_maps.placement({torch.device("cpu"): torch.device("cpu")}, "worker1", "request")
    assert to_cpu(on("cpu")) is None


def test_every_worker_refuses_a_map_naming_a_device_it_lacks():
    """init on every worker raises the same ValueError when one worker maps a device the other does not have."""
    store = dist.HashStore()
    maps = [{"worker1": {"cpu": "xpu:5"}}, {}]
    agents = [Agent(f"worker{r}", r, 2, ReferenceRpcBackendOptions(store=store, rpc_timeout=5, device_maps=maps[r]),
                    store, TpTransport(connect_timeout=5.0)) for r in range(2)]
    errors: list = [None, None]

    def start(rank: int) -> None:
        try:
            agents[rank].start()
        except Exception as exc:
            errors[rank] = exc
        finally:
            agents[rank].shutdown(graceful=False)

    threads = [threading.Thread(target=start, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(START_JOIN_S)
    # this pytest process has no xpu device
    for error in errors:
        assert isinstance(error, ValueError) and str(error).startswith(
            "worker0's device map for worker1 maps cpu to xpu:5, which worker1 does not have"), error
