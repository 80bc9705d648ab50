"""Which RPC agents exist, as data, and how a rank starts one.

Three agents speak the torch.distributed.rpc API:

* ``tensorpipe``   torch.distributed.rpc itself (TensorPipe agent);
* ``reference-pg`` backends.reference.rpc over the c10d backend under test;
* ``reference-tp`` backends.reference.rpc over direct sockets.

What differs between agents (a feature one lacks, the text of a timeout
error) is recorded here with the reason, never as a skip in a test file,
and so is how a rank starts each (``AgentSpec.start``) and, for a reference
agent, its transport (``AgentSpec.transport``): nothing branches on an
agent's name. The suites call ``api(name)`` for the module to call
``rpc_sync`` etc. on, and ``start_agent`` / ``stop_agent`` inside rank
processes.

More agents come from plugins: ``--rpc-agent-plugin MODULE`` (repeatable)
imports MODULE in pytest and in every rank (``load_plugins``) and registers
the ``AgentSpec`` (or list of them) it defines as ``DISTCONFORM_RPC_AGENTS``;
tests/harness_cases/extra_agent.py is one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

from backends.plugins import declared_by
from backends.spec import Availability, Gap, gap_for

# Message kinds that fault injection can drop or delay; the names are torch's
# (torch/csrc/distributed/rpc/message.h), which the faulty TensorPipe agent takes.
FAULTABLE_KINDS = ("SCRIPT_CALL", "PYTHON_CALL", "SCRIPT_REMOTE_CALL", "PYTHON_REMOTE_CALL",
                   "SCRIPT_RREF_FETCH_CALL", "PYTHON_RREF_FETCH_CALL", "RREF_USER_DELETE",
                   "RREF_FORK_REQUEST", "RREF_CHILD_ACCEPT", "CLEANUP_AUTOGRAD_CONTEXT_REQ")


@dataclass(frozen=True)
class Faults:
    """Drop (fail) or delay the first ``num_fail_sends`` sends of chosen message kinds."""

    fail: tuple[str, ...] = ()
    delay: dict = field(default_factory=dict)  # kind -> seconds
    num_fail_sends: int = 0


@dataclass(frozen=True)
class AfterFaults:
    """What an agent's connections are once a network fault heals, measured, not assumed
    (suites/faults/test_rpc_faults.py exercises both with rpc_sync, rpc_async, remote and to_here).

    ``silent_loss_recovers``: after frames vanished (a partition) and the network healed, the same agent's calls
    succeed again, exact. ``reset_error``: after the peer's host reset the agent's connections, every call to it
    raises at once, also after healing (the connection is dead for good), with an error matching this regular
    expression (re.search on "Type: text"); "" for an agent that recovers from resets too."""

    silent_loss_recovers: bool = True
    reset_error: str = ""


def device_maps(rank: int, devices: Sequence[str]) -> dict[str, dict[str, str]]:
    """TensorPipe's ``device_maps`` for rank ``rank`` when rank r's tensors live on ``devices[r]``: every peer's
    worker name to {this rank's device: that peer's device}. Empty when this rank is on the CPU or ``devices``
    is empty: maps move accelerator tensors, and without a map an agent refuses them."""
    if not devices or devices[rank].split(":")[0] == "cpu":
        return {}
    return {worker_name(peer): {devices[rank]: devices[peer]} for peer in range(len(devices)) if peer != rank}


def maps_for(spec: "AgentSpec", rank: int, devices: Sequence[str]) -> dict[str, dict[str, str]]:
    """The device maps the harness gives agent ``spec`` on rank ``rank`` (``device_maps``), as a user would: none
    where the rank's device type is not one whose maps the agent takes (``AgentSpec.device_map_types``)."""
    maps = device_maps(rank, devices)
    if maps and spec.device_map_types is not None and devices[rank].split(":")[0] not in spec.device_map_types:
        return {}
    return maps


def start_tensorpipe(spec: "AgentSpec", *, rank: int, world_size: int, store, init_file: str, rpc_timeout: float,
                     num_worker_threads: int, faults: Faults | None, devices: Sequence[str] = (),
                     init_method: str = "") -> None:
    """torch's own init_rpc, rendezvous through a FileStore at ``init_file`` (the faulty agent for ``faults``), or
    at ``init_method`` where one is given (``tcp://host:port``, as a user's agents meet at MASTER_ADDR).

    ``spec.tensorpipe_transports`` picks TensorPipe's transports. The faulty
    agent cannot: its options class (C++ FaultyTensorPipeRpcBackendOptions)
    offers no ``_transports`` and always takes TensorPipe's defaults.
    ``devices`` (every rank's device): ranks on accelerators map their own
    device to each peer's (``device_maps``), as a user running RPC on GPUs
    must; the faulty agent's options take no maps.
    """
    rpc = importlib.import_module(spec.module)
    if faults is not None:
        from torch.distributed.rpc import _testing  # registers FAULTY_TENSORPIPE

        options = _testing.FaultyTensorPipeRpcBackendOptions(
            num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout,
            init_method=init_method or f"file://{init_file}", messages_to_fail=list(faults.fail), messages_to_delay=dict(faults.delay),
            num_fail_sends=faults.num_fail_sends)
        backend = rpc.backend_registry.BackendType.FAULTY_TENSORPIPE
    else:
        chosen: dict = {} if spec.tensorpipe_transports is None else {"_transports": list(spec.tensorpipe_transports)}
        if spec.tensorpipe_channels is not None:
            chosen["_channels"] = list(spec.tensorpipe_channels)
        maps = maps_for(spec, rank, devices)
        if maps:
            chosen.update(device_maps=maps, devices=[devices[rank]])
        options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout,
                                                  init_method=init_method or f"file://{init_file}", **chosen)
        # the registry rebuilds the enum when FAULTY_TENSORPIPE registers: look it up now
        backend = rpc.backend_registry.BackendType["TENSORPIPE"]
    rpc.init_rpc(worker_name(rank), rank=rank, world_size=world_size, backend=backend, rpc_backend_options=options)


def start_reference(spec: "AgentSpec", *, rank: int, world_size: int, store, init_file: str, rpc_timeout: float,
                    num_worker_threads: int, faults: Faults | None, devices: Sequence[str] = (),
                    init_method: str = "") -> None:
    """The reference package's init_rpc over ``spec.transport``, rendezvous at ``init_file`` (or ``init_method``)
    as TensorPipe's.

    Like torch's init_rpc, the reference one then gives its store the RPC
    timeout: what a user's agent has, so a wait that wrongly inherits it shows
    (graceful shutdown has none). Without ``init_file`` it rendezvouses on ``store``.
    ``devices`` (every rank's device): ranks on an accelerator map their own device to each peer's, as
    TensorPipe's options do (backends/reference/rpc/device_maps.py), for any device type.
    """
    rpc = importlib.import_module(spec.module)
    rendezvous = ({"init_method": init_method} if init_method else {"init_method": f"file://{init_file}"}
                  if init_file else {"store": store})
    maps = maps_for(spec, rank, devices)
    options = rpc.ReferenceRpcBackendOptions(agent=spec.name, transport=spec.transport,
                                             num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout,
                                             faults=faults, device_maps=maps,
                                             devices=[devices[rank]] if maps else [], **rendezvous)
    rpc.init_rpc(worker_name(rank), rank=rank, world_size=world_size, rpc_backend_options=options)


@dataclass(frozen=True)
class AgentSpec:
    name: str
    module: str  # the module offering the torch.distributed.rpc API
    description: str
    timeout_error: str  # regex matched by the error of a call that ran out of time
    gaps: tuple[Gap, ...] = ()
    uses_backend: bool = False  # True: its messages travel over the c10d backend under test
    # True: a second start in the same process is not a clean agent. TensorPipe:
    # torch's RRefContext is a process-wide singleton bound to the first agent
    # ever started (rref_context.cpp getInstance), so after a re-init RRef forks
    # go to the dead agent ("RPC is no longer running on this node").
    one_start_per_process: bool = False
    # The modules offering the RPC training stack next to ``module``: torch's
    # torch.distributed.autograd / .optim / .nn for TensorPipe, the reference
    # package's twins (same names, same signatures) for the reference agents.
    autograd_module: str = "torch.distributed.autograd"
    optim_module: str = "torch.distributed.optim"  # DistributedOptimizer
    nn_module: str = "torch.distributed.nn"  # RemoteModule
    # DistributedDataParallel: its reducer writes the averaged gradients into the current distributed autograd
    # context (reducer.cpp runGradCallbackForVariable), so it must be the DDP that knows this agent's contexts
    ddp_module: str = "torch.nn.parallel"
    # How a rank starts it: start(spec, rank=, world_size=, store=, init_file=, rpc_timeout=,
    # num_worker_threads=, faults=, devices=) (see start_agent), and init_method= (a rendezvous URL that wins over
    # init_file) where suites/faults start it over the world's store
    start: Callable[..., None] = start_reference
    # A reference agent's transport: "module:factory", factory(ReferenceRpcBackendOptions) -> a
    # backends.reference.rpc.transport.Transport ("" for an agent that brings its own)
    transport: str = ""
    # Why the agent is unusable when its module's is_available() says so
    unavailable_reason: str = "its module's is_available() is False"
    # A TensorPipe agent's transports (TensorPipeRpcBackendOptions._transports); None: TensorPipe's
    # own choice, which on one host is shm first
    tensorpipe_transports: tuple[str, ...] | None = None
    # A TensorPipe agent's channels (TensorPipeRpcBackendOptions._channels); None: TensorPipe's own choice, which
    # between processes of one machine moves tensors through memory (cma), not the network (see across_hosts)
    tensorpipe_channels: tuple[str, ...] | None = None
    # False: runs only when --rpc-agent names it (a variant of another agent, not a default lane)
    selected_by_default: bool = True
    # what its connections are after a network fault heals (None: undeclared, every rank must agree)
    after_faults: AfterFaults | None = None
    # the device types whose tensors its options map (device_maps=, devices=); None: any. On ranks of another
    # device type the harness starts it without maps, as a user must (maps_for), and it refuses their tensors
    device_map_types: tuple[str, ...] | None = None

    def availability(self) -> Availability:
        try:
            mod = importlib.import_module(self.module)
        except Exception as exc:  # an availability probe never crashes collection
            return Availability(False, f"cannot import {self.module}: {exc!r}")
        is_available = getattr(mod, "is_available", None)
        if is_available is not None and not is_available():
            return Availability(False, self.unavailable_reason)
        return Availability(True)

    def gap_for(self, **need) -> Gap | None:
        """The first of this agent's gaps covering ``need`` (backends/spec.py:gap_for)."""
        return gap_for(self.gaps, **need)


REFERENCE_GAPS = (
    Gap({"rpc_feature": "wait_all_early_error"},
        "a Python agent can only fail a torch Future with Future.set_exception, which stores the exception "
        "as a value (no C++ error): torch.futures.wait_all (torch._C._collect_all) then waits for every "
        "future and raises the first failed one in list order, not the first to fail"),
)


# suites/faults/test_rpc_faults.py, measured on torch 2.13 on simulated hosts (docs/faults.md), RPC timeout 2 s
SILENT_FAULTS = ("partition", "one_way", "flap", "data_plane", "frozen")  # frames vanish: only a timeout ends a wait
TIMEOUT_TEXT_NAMES_NOTHING = (
    "torch's RPC timeout error names neither the call nor the peer: 'RPCErr:1:RPC ran for more than set timeout "
    "(2000 ms) and will now be marked with an error' (rpc_sync, rpc_async, remote and to_here alike, at 2.00 s, under "
    "every silent fault: partition, one_way, flap, frozen, data_plane)")
REFERENCE_FAULT_GAPS = (
    Gap({"clause": "test_the_error_names_the_call_or_the_peer", "fault": SILENT_FAULTS},
        TIMEOUT_TEXT_NAMES_NOTHING + "; the reference agents raise torch's text verbatim, so that code matching "
        "it (suites/rpc/test_timeouts.py's AgentSpec.timeout_error) runs unchanged"),
)
REFERENCE_PG_FAULT_GAPS = (
    # measured on torch 2.13 over gloo, --faults cut_after_bytes (each connection of the cut rank's host reset once
    # it carried 256 KiB, in the middle of 1 MiB calls), six runs at ws2 and ws3 with the transport's watch of each
    # connection (pg_transport.py _watch), with which the cut-off rank's calls raised at once in all six (4 of 6
    # waited out the timeout before it)
    Gap({"clause": ("test_the_error_names_the_call_or_the_peer", "test_after_healing_the_agent_is_as_declared"),
         "fault": "cut_after_bytes"},
        "reference-pg cannot see a connection its peer's host reset while it has nothing to send on it: the reset "
        "reaches the side that sends next, and a rank whose frames to the cut peer wait behind sends that never "
        "complete (gloo completes a send once the receiver takes it) sends nothing more, so no reset reaches it, "
        "gloo fails none of its receives, and its calls end by their timeout: 'RPCErr:1:RPC ran for more than set "
        "timeout (2000 ms) and will now be marked with an error', under the cut and again after healing (six runs "
        "at ws2 and ws3: the naming clause met it in 5 at ws3 and 2 at ws2, the after-healing clause in 3 at ws3, "
        "rank 1's four calls to the cut rank 2 each running into the 2 s timeout; the ranks the reset reached "
        "raised at once, naming the peer; under the cut rank 0's or rank 1's calls timed out, never the cut "
        "rank's). TensorPipe writes each call at once, meets the reset and "
        "fails the pipe ('ECONNRESET')",
        outcome="intermittent"),
)


class TrainingStack(TypedDict):
    """The AgentSpec fields naming an agent's RPC training stack."""

    autograd_module: str
    optim_module: str
    nn_module: str
    ddp_module: str


# backends/reference/rpc/{autograd,optim,nn}.py mirror torch.distributed.{autograd,optim,nn}, and
# backends/reference/ddp torch.nn.parallel's DistributedDataParallel
REFERENCE_STACK = TrainingStack(autograd_module="backends.reference.rpc.autograd",
                                optim_module="backends.reference.rpc.optim", nn_module="backends.reference.rpc.nn",
                                ddp_module="backends.reference.ddp")

TENSORPIPE = AgentSpec(
    name="tensorpipe", module="torch.distributed.rpc",
    description="torch.distributed.rpc's TensorPipe agent (the agent users run today)",
    # remote() reports its own text when the RRef creation timed out
    timeout_error=r"RPC ran for more than|RRef creation via rpc\.remote\(\) timed out",
    one_start_per_process=True, start=start_tensorpipe,
    unavailable_reason="torch was built without torch.distributed.rpc",
    gaps=(
        Gap({"rpc_feature": "custom_exception_type", "rpc_call": ("rpc_sync", "rpc_async", "rref_method")},
            "a remote exception reaching the caller through a C++ future is re-raised by c10::Error "
            "translation: a user-defined subclass comes back as the nearest builtin type torch knows "
            "(ValueError, else RuntimeError), message kept; remote().to_here() keeps the subclass"),
        Gap({"rpc_feature": "unused_send_function"},
            "torch's FAST-mode distributed backward treats every send function recorded in the context as a "
            "root that must receive gradients (dist_engine.cpp computeDependencies); one that never does "
            "blocks backward forever (spec B9, torch's own test_backward_unused_send_function checks the "
            "thread is still alive after 10 s): running the clause would leave a thread blocked in the rank",
            outcome="skip"),
        Gap({"rpc_feature": "rref_to_owner_before_created"},
            "an RRef that reaches its owner while remote() is still building the value, passed by the owner "
            "to itself in an RPC (a RemoteModule sent to its own worker, whose forward calls itself), gets "
            "no answer: 'RPC ran for more than set timeout'; after that a graceful rpc.shutdown() blocks "
            "(measured with two plain torch processes: every time with a 0.2 s creation, about 1 in 300 "
            "with an instant one; never once the caller's to_here() has confirmed the RRef)",
            outcome="skip"),
        Gap({"clause": "test_the_error_names_the_call_or_the_peer", "fault": SILENT_FAULTS},
            TIMEOUT_TEXT_NAMES_NOTHING),
        Gap({"clause": "test_the_error_names_the_call_or_the_peer", "fault": ("refused", "cut_after_bytes")},
            "TensorPipe's error for a reset connection names neither the call nor the peer: 'ECONNRESET: "
            "connection reset by peer (this error originated at tensorpipe/transport/uv/connection_impl.cc:157)'"),
        Gap({"clause": "test_graceful_shutdown_ends_within_its_timeout", "fault": SILENT_FAULTS},
            "torch 2.13's rpc.shutdown(graceful=True, timeout=2) under a partition, with a call in flight across "
            "it, never returned within 7 s on either worker (without a call in flight: the follower raised 'RPC "
            "ran for more than set timeout (2000 ms)' after 6.7 s, the leader never returned). _all_gather's "
            "signal wait is bounded, but TensorPipeAgent::join(shutdown, float /* unused */) ignores the timeout "
            "and waits for every worker's calls to drain (tensorpipe_agent.cpp). Intermittent, not strict: in "
            "another run one worker raised 'Followers [...] timed out in _all_gather after 2.00 seconds' after "
            "5.6 s, near the 5 s bound, so a run may meet it. The other silent faults alike (ws2): under one_way "
            "neither worker returned within 7 s; under flap and data_plane the leader never returned and the "
            "follower raised 'RPC ran for more than set timeout (2000 ms)' after 6.3 s and 5.0 s; with the follower "
            "frozen the leader never returned (the follower, let go, raised 'Wait timeout' after 3.0 s)",
            outcome="intermittent"),
        Gap({"clause": "test_connecting_ends_within_the_agent_timeout", "fault": SILENT_FAULTS},
            "torch 2.13's init_rpc under a partition (rpc_timeout=2) never returned within 7 s on either worker: "
            "its start-up _all_gather is bounded by the RPC timeout, but the gloo group init_rpc makes for its "
            "barrier (backend_registry.py _init_process_group, group.barrier().wait()) is not "
            "(pytorch/gloo#520: gloo's connect has no bound). The same under one_way, flap and data_plane (neither "
            "worker returned within 7 s, ws2); with worker1 frozen before init_rpc, worker0's never returned within "
            "7 s (worker1's, once let go, returned in 0.06 s)"),
        # the agents meet at the world's store here (tcp://<switch>:<port>, every worker a client), as a user's do
        Gap({"clause": "test_graceful_shutdown_ends_within_its_timeout", "fault": "control_plane"},
            "torch 2.13's rpc.shutdown(graceful=True, timeout=2) with the store cut off from the last worker's host "
            "(the agents met at that store, as a user's meet at MASTER_ADDR): the workers that reach the store raise "
            "'DistStoreError: wait timeout after 2000ms, keys: /rpc_prefix_0/shutdown/READY_ID_1' after 2 s, the cut-off "
            "one never returned within 7 s (ws2 and ws3, two runs each): its store request is never answered, and "
            "torch's TCPStore client never gives it up (TCPSTORE_GET_UNBOUNDED)"),
        Gap({"clause": "test_connecting_ends_within_the_agent_timeout", "fault": "control_plane"},
            "torch 2.13's init_rpc (rpc_timeout=2) with the store cut off from the last worker's host before the "
            "agents start never returned within 7 s on any worker (ws2 and ws3, two runs each): init_rpc "
            "rendezvouses (dist.rendezvous) under c10d's default timeout, 30 minutes, and gives the store the RPC "
            "timeout only once reached (the reference agents rendezvous under the RPC timeout: every worker raised "
            "'DistStoreError: wait timeout after 2000ms, keys: /reference_rpc_0/agent/name/<cut rank>' in 2.09-2.15 s)"),
        Gap({"rpc_feature": "async_future_exception"},
            "torch.futures.Future.set_exception stores the exception as the future's value with a "
            "Python-only unwrap function; the agent's C++ side sends that value back, so the caller "
            "gets the exception object returned instead of raised"),
        # measured on torch 2.13 with two processes on dcdev:0 and dcdev:1 (native/device/)
        Gap({"rpc_feature": "device_maps", "device_type": "dcdev"},
            "TensorPipe maps CUDA devices only: TensorPipeRpcBackendOptions(device_maps={'worker1': {'dcdev:0': "
            "'dcdev:1'}}, devices=['dcdev:0']) raises \"ValueError: `set_devices` expect a list of CUDA devices, "
            "but got device type dcdev.\" (options.py _to_device); the same maps without devices pass the options "
            "but init_rpc refuses them, counting devices with torch.cuda.device_count(): \"ValueError: Node worker0 "
            "has source devices with invalid indices in its device map for worker1 / device map = "
            "{device(type='dcdev', index=0): device(type='dcdev', index=1)} / device count = 0\" "
            "(backend_registry.py _validate_device_maps). So on dcdev ranks it runs without maps "
            "(device_map_types), and a dcdev tensor is refused: \"RuntimeError: TensorPipe RPC backend only "
            "supports CPU tensors by default, please move your tensors to CPU before sending them over RPC, or call "
            "`set_device_map` on `TensorPipeRpcBackendOptions` to explicitly configure device mapping. Request "
            "device mapping is not available for destination worker1, but found tensor on device: dcdev:0\""),
        # suites/profiling: shows in some runs only (timing), hence intermittent. One cause for both: torch 2.13's
        # TensorPipe worker thread profiles only the first profiled request it serves
        # (python -m suites.profiling.measure --thread-reuse 4: the 4 calls served by fresh threads brought their
        # events, the 8 served by reused threads came back empty), and its pool hands a queued request to
        # whichever thread asks first.
        Gap({"workload": "concurrent_calls"},
            "torch 2.13's TensorPipe loses remote events of profiled calls in flight at once "
            "(measured: 4 or 5 of 8 calls brought theirs back, with 1024 worker threads; some runs get all 8): "
            "a worker thread profiles only the first profiled request it serves, and calls in flight at once "
            "queue for threads that served one",
            outcome="intermittent"),
        Gap({"rpc_feature": "profiled_callee_events"},
            "torch 2.13's TensorPipe worker thread profiles only the first profiled request it serves (measure "
            "--thread-reuse 4: 8 of 8 calls on reused threads came back without the callee's events, 0 of 4 on "
            "fresh ones); on a loaded machine its pool now and then hands a request to a thread finishing one "
            "(a default run's ws3 python_udf rpc_sync came back with only 'rpc_sync#udf_several_ops(worker0 -> "
            "worker1)', 1 run in 14)",
            outcome="intermittent"),
    ),
    # uv (loopback TCP), not shm: TensorPipe's shm transport busy-polls its rings, so every idle rank
    # of a live agent burns about two thirds of a core in system time (measured on torch 2.13, ws3:
    # 2.9 s sys per rank in 5 idle seconds; uv: 0.0). On a 2-core machine that starves the ranks the
    # clause is waiting on. uv is also what TensorPipe uses between hosts. tensorpipe-shm keeps shm.
    tensorpipe_transports=("uv",),
    # its options take CUDA devices only (options.py _to_device; the gap device_maps above quotes the refusals)
    device_map_types=("cuda",),
    # measured on torch 2.13 on simulated hosts (docs/faults.md): the pipe survives silent loss and works again
    # after healing; a reset kills it for good ("ECONNRESET: connection reset by peer (this error originated at
    # tensorpipe/transport/uv/connection_impl.cc:157)" at once, healed or not)
    after_faults=AfterFaults(silent_loss_recovers=True, reset_error=r"RuntimeError: (ECONNRESET|EOF)"))

AGENTS: dict[str, AgentSpec] = {
    "tensorpipe": TENSORPIPE,
    "tensorpipe-shm": replace(
        TENSORPIPE, name="tensorpipe-shm", tensorpipe_transports=None, selected_by_default=False,
        description="torch.distributed.rpc's TensorPipe agent with TensorPipe's own transports (shm on one host): "
                    "run it with --rpc-agent tensorpipe-shm (its shm transport busy-polls a core per rank)"),
    "reference-pg": AgentSpec(
        name="reference-pg", module="backends.reference.rpc", **REFERENCE_STACK,
        description="reference agent whose messages travel over the c10d backend under test",
        timeout_error="RPC ran for more than", uses_backend=True,
        # gloo's pairs outlive silent loss (the transport's group has a days-long timeout, so none times out);
        # a reset fails gloo's pair for good: "RPC to WorkerInfo(id=1, name=worker1) failed: reference-pg: cannot
        # send to rank 1: posting a frame to rank 1 failed: [.../gloo/transport/tcp/pair.cc:553] Connection closed
        # by peer", or, when the pair broke under a send already posted, "RPC to WorkerInfo(id=2, name=worker2)
        # failed: sending a frame to rank 2 over gloo failed: [.../gloo/transport/tcp/pair.cc:553] ..."
        after_faults=AfterFaults(silent_loss_recovers=True, reset_error=r"Error: RPC to .*failed: .*rank \d"),
        transport="backends.reference.rpc.transports:over_process_group",
        gaps=REFERENCE_GAPS + REFERENCE_FAULT_GAPS + REFERENCE_PG_FAULT_GAPS + (
            # matched on the backend under test (fixtures/rpc_plugin.py adds it to every case's needs)
            Gap({"backend": "nccl"},
                "reference-pg's listener receives frames from any source, which ProcessGroupNCCL does not offer "
                "(ProcessGroupNCCL.cpp recvAnysource raises NotImplementedError \"ProcessGroupNCCL does not support "
                "recvAnysource\"): PgTransport.start() posts its first receives (frames staged through the rank's "
                "GPU, NCCL moving CUDA tensors only) and fails with that error (torch's source; not run here)",
                outcome="skip"),
        )),
    "reference-tp": AgentSpec(
        name="reference-tp", module="backends.reference.rpc", **REFERENCE_STACK,
        description="reference agent over direct loopback sockets, tensors as raw bytes",
        timeout_error="RPC ran for more than", gaps=REFERENCE_GAPS + REFERENCE_FAULT_GAPS,
        transport="backends.reference.rpc.transports:over_sockets",
        # TensorPipe's shape: the socket outlives silent loss, a reset drops it for good ("RPC to
        # WorkerInfo(id=1, name=worker1) failed: reference-tp rank 0: rank 1 is not connected" at once)
        after_faults=AfterFaults(silent_loss_recovers=True, reset_error=r"Error: RPC to .*failed: .*rank \d")),
}


def across_hosts(spec: AgentSpec) -> AgentSpec:
    """``spec`` as it runs between hosts, for ranks on simulated hosts that still share one machine (suites/faults).

    Between processes of one machine TensorPipe moves tensors through memory (its cma channel, shm transport),
    so a fault on the network would never touch them; between real hosts only the network is there: the uv
    transport and the basic channel (docs/faults.md measured TensorPipe that way). A reference agent is unchanged:
    its bytes always cross its transport."""
    if spec.start is not start_tensorpipe:
        return spec
    return replace(spec, tensorpipe_transports=("uv",), tensorpipe_channels=("basic",))


class RpcAgentPluginError(ImportError):
    pass


def register(spec: AgentSpec) -> None:
    """Add ``spec`` to AGENTS (again: a no-op); a different spec under a taken name is an error."""
    known = AGENTS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"RPC agent {spec.name!r} is already defined; a plugin cannot redefine it")
    AGENTS[spec.name] = spec


def load_plugin(module_name: str) -> list[AgentSpec]:
    """Import an RPC agent plugin and register the specs it declares (``DISTCONFORM_RPC_AGENTS``)."""
    specs = declared_by(module_name, "DISTCONFORM_RPC_AGENTS", option="--rpc-agent-plugin", error=RpcAgentPluginError)
    if specs is None:
        raise RpcAgentPluginError(f"--rpc-agent-plugin {module_name}: it defines no DISTCONFORM_RPC_AGENTS "
                                  "(an AgentSpec or a list of them)")
    for spec in specs:
        if not isinstance(spec, AgentSpec):
            raise RpcAgentPluginError(f"--rpc-agent-plugin {module_name}: DISTCONFORM_RPC_AGENTS holds "
                                      f"{type(spec).__name__}, not an AgentSpec")
        try:
            register(spec)
        except ValueError as exc:
            raise RpcAgentPluginError(f"--rpc-agent-plugin {module_name}: {exc}") from None
    return specs


def load_plugins(module_names: Iterable[str]) -> None:
    for module_name in module_names:
        load_plugin(module_name)


class UnknownAgent(ValueError):
    pass


def default_agents() -> list[str]:
    """The agents a run uses when --rpc-agent names none."""
    return [name for name, spec in AGENTS.items() if spec.selected_by_default]


def get(name: str) -> AgentSpec:
    try:
        return AGENTS[name]
    except KeyError:
        raise UnknownAgent(f"unknown RPC agent {name!r}; known agents: {', '.join(AGENTS)}") from None


def api(name: str):
    """The module whose rpc_sync/rpc_async/remote/RRef/... this agent answers to."""
    return importlib.import_module(get(name).module)


def autograd(name: str):
    """The module offering ``context``/``backward``/``get_gradients`` for this agent."""
    return importlib.import_module(get(name).autograd_module)


def optim(name: str):
    """The module offering ``DistributedOptimizer`` for this agent."""
    return importlib.import_module(get(name).optim_module)


def nn(name: str):
    """The module offering ``RemoteModule`` for this agent."""
    return importlib.import_module(get(name).nn_module)


def ddp(name: str):
    """The module offering ``DistributedDataParallel`` that writes into this agent's autograd contexts."""
    return importlib.import_module(get(name).ddp_module)


def worker_name(rank: int) -> str:
    return f"worker{rank}"


def start_agent(name: str, *, rank: int, world_size: int, store, init_file: str,
                rpc_timeout: float = 60.0, num_worker_threads: int = 16, faults: Faults | None = None,
                devices: Sequence[str] = ()):
    """Start agent ``name`` in this rank as ``worker{rank}``; return its API module.

    Every rank must pass the same ``store`` (reference agents rendezvous on it;
    give each start a fresh PrefixStore) and the same fresh ``init_file`` path
    (TensorPipe rendezvous through a FileStore: no port to collide on).
    ``devices``: every rank's device, for the agents that map devices
    (empty: no maps).
    """
    spec = get(name)
    spec.start(spec, rank=rank, world_size=world_size, store=store, init_file=init_file, rpc_timeout=rpc_timeout,
               num_worker_threads=num_worker_threads, faults=faults, devices=tuple(devices))
    return api(name)


def stop_agent(name: str, graceful: bool = True) -> None:
    api(name).shutdown(graceful=graceful)
