"""Device maps of the reference agents: TensorPipe's ``device_maps`` and ``devices``, for any device type.

``ReferenceRpcBackendOptions(device_maps={"worker1": {"dcdev:0": "dcdev:1"}}, devices=["dcdev:0"])`` says, as
``TensorPipeRpcBackendOptions`` does, where this worker's tensors land on a peer: a tensor on ``dcdev:0`` sent to
worker1 arrives there on ``dcdev:1``. The rules are TensorPipe's (torch/csrc/distributed/rpc/tensorpipe_agent.cpp
``getDevicesForRemote`` / ``getDevicesForTensors``, torch/distributed/rpc/backend_registry.py
``_validate_device_maps``), with one difference: any device type torch knows, where TensorPipe takes CUDA only
(its options refuse others: "`set_devices` expect a list of CUDA devices, but got device type dcdev.").

* A request uses the sender's map for the destination, a response the inverse of the caller's map for the callee
  (TensorPipe's reverse device maps), so a reply comes back on the device its request left from.
* Without a map for the destination every tensor must be on the CPU: a device tensor is refused with an error
  naming the device and the destination, never moved to the CPU silently. With one, a device tensor whose device
  the map does not name is refused too; a CPU tensor stays on the CPU unless the map names ``cpu``.
* A tensor travels as its bytes: the sender copies it to the host with the device's own copy (``Tensor.cpu()``,
  never a host read of device memory) and the receiver copies it onto the device the sender's map named.

Checked when the options are made (devices parse, a map is one-to-one, a map's source devices are among
``devices``) and when the agents start (every worker publishes its maps, devices and accelerator through the
store, and each checks the whole world's as ``_validate_device_maps`` does: worker names, device indices, target
devices among the target's ``devices``), so every worker raises the same ValueError.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import torch

DeviceLike: TypeAlias = "int | str | torch.device"
DeviceMap: TypeAlias = "dict[torch.device, torch.device]"


# ------------------------------------------------------------------ options
def to_device(value: DeviceLike, where: str) -> torch.device:
    """``value`` as a torch.device with an index (an accelerator device) or the CPU; a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str, torch.device)):
        raise TypeError(f"{where}: expected a device (torch.device, 'type:index' or an index), got "
                        f"{type(value).__name__} {value!r}")
    try:
        device = torch.device(value)
    except RuntimeError as exc:  # torch.device's own text says what is wrong with the string
        raise ValueError(f"{where}: {value!r} is not a device: {exc}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is None:
        raise ValueError(f"{where}: {device} names no device index; device maps need one device, e.g. "
                         f"'{device.type}:0'")
    return device


def to_device_map(to: str, mapping: Mapping[DeviceLike, DeviceLike]) -> DeviceMap:
    """One peer's map as torch.devices; two sources mapped to one target is an error (TensorPipe: 1-to-1 only)."""
    if not isinstance(to, str):
        raise TypeError(f"device_maps: keys are worker names (str), got {type(to).__name__} {to!r}")
    if not isinstance(mapping, Mapping):
        raise TypeError(f"device_maps[{to!r}]: expected a dict {{this worker's device: {to}'s device}}, got "
                        f"{type(mapping).__name__} {mapping!r}")
    full: DeviceMap = {}
    sources: dict[torch.device, torch.device] = {}  # target -> the source mapped to it
    for key, value in mapping.items():
        source = to_device(key, f"device_maps[{to!r}]")
        target = to_device(value, f"device_maps[{to!r}][{key!r}]")
        if source in full and full[source] != target:
            raise ValueError(f"device_maps[{to!r}] maps {source} twice, to {full[source]} and to {target}")
        if target in sources and sources[target] != source:
            # TensorPipe's text (options.py _to_device_map), naming the peer
            raise ValueError(f"device_maps[{to!r}] only supports 1-to-1 mapping, trying to map {sources[target]} "
                             f"and {source} to {target}")
        full[source], sources[target] = target, source
    return full


def to_device_maps(maps: Mapping[str, Mapping[DeviceLike, DeviceLike]] | None) -> dict[str, DeviceMap]:
    if maps is None:
        return {}
    if not isinstance(maps, Mapping):
        raise TypeError(f"device_maps: expected a dict {{worker name: {{device: device}}}}, got "
                        f"{type(maps).__name__} {maps!r}")
    return {to: to_device_map(to, mapping) for to, mapping in maps.items()}


def to_devices(devices: Iterable[DeviceLike] | None) -> list[torch.device]:
    if devices is None:
        return []
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Iterable):
        raise TypeError(f"devices: expected a list of devices, got {type(devices).__name__} {devices!r}")
    listed = [to_device(d, "devices") for d in devices]
    for i, device in enumerate(listed):
        if device in listed[:i]:
            raise ValueError(f"devices lists {device} twice: {[str(d) for d in listed]}")
    return listed


def check_sources(maps: Mapping[str, DeviceMap], devices: list[torch.device]) -> None:
    """With ``devices`` given, every map's source devices are among them (TensorPipe checks it at init_rpc)."""
    if not devices:
        return
    for to, mapping in maps.items():
        unexpected = [str(d) for d in mapping if d.type != "cpu" and d not in devices]
        if unexpected:
            raise ValueError(f"device_maps[{to!r}] maps {', '.join(unexpected)}, which devices "
                             f"{[str(d) for d in devices]} does not list")


# ------------------------------------------------------------------ the world at start
@dataclass(frozen=True)
class Advertised:
    """What one worker publishes at start: its name, its accelerator (type, count), its devices and maps."""

    name: str
    accelerator: str | None
    device_count: int
    devices: tuple[str, ...]
    maps: dict[str, dict[str, str]]

    def encode(self) -> bytes:
        return json.dumps({"name": self.name, "accelerator": self.accelerator, "device_count": self.device_count,
                           "devices": list(self.devices), "maps": self.maps}).encode()

    @staticmethod
    def decode(data: bytes) -> Advertised:
        fields = json.loads(data)
        return Advertised(fields["name"], fields["accelerator"], int(fields["device_count"]),
                          tuple(fields["devices"]), {to: dict(m) for to, m in fields["maps"].items()})

    def has(self, device: torch.device) -> bool:
        """Whether this worker has ``device`` (the CPU, or an index of its accelerator)."""
        return device.type == "cpu" or (device.type == self.accelerator and 0 <= device.index < self.device_count)

    def what_it_has(self) -> str:
        if self.accelerator is None:
            return "it has no accelerator"
        return f"it has {self.device_count} {self.accelerator} device{'s' if self.device_count != 1 else ''}"


def advertise(name: str, maps: Mapping[str, DeviceMap], devices: list[torch.device]) -> Advertised:
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return Advertised(name, None if accelerator is None else accelerator.type,
                      int(torch.accelerator.device_count()) if accelerator is not None else 0,
                      tuple(str(d) for d in devices),
                      {to: {str(s): str(t) for s, t in m.items()} for to, m in maps.items()})


def check_world(workers: list[Advertised]) -> None:
    """The whole world's maps and devices are consistent (TensorPipe's _validate_device_maps); ValueError if not."""
    by_name = {w.name: w for w in workers}
    for worker in workers:
        for text in worker.devices:
            if not worker.has(torch.device(text)):
                raise ValueError(f"{worker.name}'s devices name {text}, which {worker.name} does not have "
                                 f"({worker.what_it_has()})")
    for worker in workers:
        unknown = sorted(to for to in worker.maps if to not in by_name)
        if unknown:
            raise ValueError(f"{worker.name} has device maps for {', '.join(unknown)}, which are not workers of "
                             f"this world ({', '.join(by_name)})")
        for to, mapping in worker.maps.items():
            target = by_name[to]
            for source_text, target_text in mapping.items():
                source, dest = torch.device(source_text), torch.device(target_text)
                if not worker.has(source):
                    raise ValueError(f"{worker.name}'s device map for {to} maps {source}, which {worker.name} does "
                                     f"not have ({worker.what_it_has()})")
                if target.devices and dest.type != "cpu" and target_text not in target.devices:
                    raise ValueError(f"{worker.name}'s device map for {to} maps {source} to {dest}, which {to}'s "
                                     f"devices {list(target.devices)} do not list")
                if not target.has(dest):
                    raise ValueError(f"{worker.name}'s device map for {to} maps {source} to {dest}, which {to} "
                                     f"does not have ({target.what_it_has()})")


def reverse_maps(me: str, workers: list[Advertised]) -> dict[str, DeviceMap]:
    """For each worker that maps devices to ``me``: the inverse of its map, what ``me``'s replies to it use."""
    reverse: dict[str, DeviceMap] = {}
    for worker in workers:
        mapping = worker.maps.get(me)
        if mapping:
            reverse[worker.name] = {torch.device(t): torch.device(s) for s, t in mapping.items()}
    return reverse


# ------------------------------------------------------------------ one message
def placement(mapping: DeviceMap | None, destination: str, what: str):
    """The function serialize asks, per tensor of a message to ``destination``, where it lands there.

    ``mapping``: the map for ``destination`` (None: there is none); ``what``: "request" or "response".
    It returns the device (None: the CPU) or raises RuntimeError naming the tensor's device and the destination.
    """
    def place(tensor: torch.Tensor) -> torch.device | None:
        device = tensor.device
        target = None if mapping is None else mapping.get(device)
        if target is None:
            if device.type == "cpu":
                return None
            if mapping is None:
                why = (f"there is no device map for {destination}" if what == "request" else
                       f"{destination} has no device map for this worker (a response uses the inverse of the "
                       f"caller's map)")
            else:
                shown = {str(s): str(t) for s, t in mapping.items()}
                why = f"the device map for {destination} ({shown}) does not name device {device}"
            raise RuntimeError(f"RPC sends only CPU tensors unless a device map says where a device's tensors "
                               f"land: the {what} to {destination} holds a tensor on device {device}, and {why}. "
                               f"Move it to the CPU, or set device_maps={{{destination!r}: {{'{device}': ...}}}} "
                               f"in the caller's options")
        return None if target.type == "cpu" else target
    return place
