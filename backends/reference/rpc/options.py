"""ReferenceRpcBackendOptions: what init_rpc needs to start a reference agent."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.rpc_agents import Faults

from . import device_maps as maps

# the transport ("module:factory", see transports.py) of each built-in reference agent;
# another agent (a plugin's) names its own with ``transport=``
TRANSPORTS = {"reference-tp": "backends.reference.rpc.transports:over_sockets",
              "reference-pg": "backends.reference.rpc.transports:over_process_group"}
AGENTS = tuple(TRANSPORTS)


@dataclass
class ReferenceRpcBackendOptions:
    """Options of the reference agents (torch's RpcBackendOptions fields, plus ours).

    * ``agent``: ``"reference-tp"`` (direct sockets) or ``"reference-pg"``
      (frames over the default c10d process group), or any name given with
      ``transport``;
    * ``transport``: the transport's factory as "module:factory"
      (transports.py); by default the named agent's;
    * ``num_worker_threads``: how many requests run at once;
    * ``rpc_timeout``: default per-call timeout in seconds, 0 = none;
    * ``store``: a c10d Store shared by every worker of this agent (a fresh
      one, or a fresh PrefixStore, per init); else ``init_method``
      (``file://``, ``tcp://``; default ``env://`` as torch) is rendezvoused as torch does;
    * ``listen_host``: where reference-tp listens; by default as TensorPipe chooses, the address of
      ``TP_SOCKET_IFNAME``'s interface when set, else loopback;
    * ``faults``: a ``backends.rpc_agents.Faults`` to drop or delay chosen
      message kinds (wraps the transport in faulty.FaultyTransport);
    * ``device_maps``, ``devices``: TensorPipeRpcBackendOptions' (``{worker name: {my device: its device}}``,
      the devices this worker uses), for any device type (device_maps.py); ``set_device_map`` and
      ``set_devices`` as TensorPipe's. Read back as torch.devices.
    """

    agent: str = "reference-tp"
    transport: str | None = None
    num_worker_threads: int = 16
    rpc_timeout: float = 60.0
    store: object = None
    init_method: str | None = None
    listen_host: str | None = None
    faults: Faults | None = None
    device_maps: dict = field(default_factory=dict)
    devices: list = field(default_factory=list)

    def __post_init__(self):
        self.device_maps = maps.to_device_maps(self.device_maps)
        self.devices = maps.to_devices(self.devices)
        maps.check_sources(self.device_maps, self.devices)
        if not self.transport:
            if self.agent not in TRANSPORTS:
                raise ValueError(f"unknown reference RPC agent {self.agent!r}; known: {', '.join(AGENTS)} "
                                 "(another agent names its transport=)")
            self.transport = TRANSPORTS[self.agent]
        if isinstance(self.num_worker_threads, bool) or not isinstance(self.num_worker_threads, int) \
                or self.num_worker_threads < 1:
            raise ValueError(f"num_worker_threads must be a positive int, got {self.num_worker_threads!r}")
        if isinstance(self.rpc_timeout, bool) or not isinstance(self.rpc_timeout, (int, float)) \
                or self.rpc_timeout < 0:
            raise ValueError(f"rpc_timeout must be seconds >= 0 (0 = no timeout), got {self.rpc_timeout!r}")

    def set_device_map(self, to: str, device_map: dict) -> None:
        """Add ``device_map`` to the map for worker ``to`` (TensorPipeRpcBackendOptions.set_device_map)."""
        added = maps.to_device_map(to, device_map)
        merged = dict(self.device_maps.get(to, {}))
        for source, target in added.items():
            if source in merged and merged[source] != target:
                # TensorPipe's text (options.py set_device_map)
                raise ValueError(f"`set_device_map` only supports 1-to-1 mapping, trying to map {source} to {target} "
                                 f"and {merged[source]}")
            merged[source] = target
        candidate = {**self.device_maps, to: maps.to_device_map(to, merged)}  # checks one-to-one again
        maps.check_sources(candidate, self.devices)
        self.device_maps = candidate

    def set_devices(self, devices: list) -> None:
        """The devices this worker uses (TensorPipeRpcBackendOptions.set_devices), any device type."""
        listed = maps.to_devices(devices)
        maps.check_sources(self.device_maps, listed)
        self.devices = listed
