"""The native backend: a c10d Backend in C++ (this folder), registered as ``native``.

Ranks of one host exchange data through one shared-memory segment per process
group (see native.hpp for a map of the sources). Importing this package
registers the backend; the extension is compiled on first use (build.py) and
reused afterwards::

    import native
    dist.init_process_group("native", store=store, rank=rank, world_size=n)
    dist.all_reduce(t)

For the suite it is a project backend like ``reference``: ``--backend native``.
Its flight recorder is its own (torch's cannot be recorded into from an
extension): flight_recorder.py registers it where the harness reads it.
``check_available`` builds the extension in the pytest controller before any
rank starts, so ranks only load the finished library, and a compiler error
becomes one skip reason instead of a traceback per case.
"""

from __future__ import annotations

import torch.distributed as dist

from backends.spec import (FLIGHT_RECORDER_PARTS, LOCAL_SYNC_DESYNCS_GROUP_NAMES, MONITORED_BARRIER_GLOO_ONLY,
                           TCPSTORE_GET_UNBOUNDED,
                           SPLIT_NEEDS_ACCELERATOR, AfterTimeout, Availability, BackendSpec, Gap, ResourceBudget)

from backends.flight_recorders import recorder_size

from . import build, flight_recorder

NAME = "native"

GAPS = (
    MONITORED_BARRIER_GLOO_ONLY,
    # suites/faults: native's data moves through shared memory on one host, so a fault on a simulated host's
    # link never reaches it; what does reach it is a frozen peer and the store's own connections
    Gap({"fault": ("partition", "refused", "one_way", "flap", "slow", "lossy", "cut_after_bytes", "data_plane")},
        "native moves data through shared memory on one host, not over the network: a fault on a simulated "
        "host's link never reaches its collectives (only a frozen peer and the store's connections do)",
        outcome="skip"),
    TCPSTORE_GET_UNBOUNDED,  # torch's store, whatever the backend
    # what a native group's backend offers beyond collectives (suites/c10d/test_capabilities.py,
    # test_backend_state.py), measured on torch 2.13 at ws2 and ws3: it coalesces and shrinks (after a rank
    # left too) as it advertises, and merges (test_shrink_and_options.py); the rest c10d refuses for a plugin
    # backend before native is asked
    Gap({"feature": "backend_options"},
        "torch 2.13 binds a backend's options for its own backends only (ProcessGroupGloo/NCCL.options): for a "
        "plugin, group._get_backend(cpu).options fails with \"AttributeError: 'torch._C._distributed_c10d.Backend' "
        "object has no attribute 'options'\", though native answers c10d's getBackendOptions() (its timeout) in C++ "
        "(under DETAIL torch's _ProcessGroupWrapper answers for it, with the right timeout: no gap there)",
        unless_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, torch="<2.14"),  # 2.14.1 answers (XPASS, ws2 and ws3)
    Gap({"clause": "test_shrink_after_a_rank_died"},
        "under TORCH_DISTRIBUTED_DEBUG=DETAIL shrink_group's group escapes torch's wrapper: the parent group's "
        "backend is a _ProcessGroupWrapper reporting its timeout, the shrunk group's is the bare native Backend, "
        "which torch 2.13 gives no options: \"the shrunk group reports timeout AttributeError: "
        "'torch._C._distributed_c10d.Backend' object has no attribute 'options' (Backend), its parent 0:00:41 "
        "(_ProcessGroupWrapper)\" (the shrink itself works; new_group's groups are wrapped)",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    Gap({"clause": "test_advertised_capability_works", "feature": ("time_estimate", "tensor_alloc")},
        "native does not advertise them: its Backend's supports_time_estimate and supports_tensor_alloc(cpu) are "
        "False (c10d's defaults; torch 2.13)"),
    Gap({"feature": "completion_hook"},
        "c10d refuses completion hooks for every backend but NCCL: group._register_on_completion_hook(hook) fails "
        "with 'RuntimeError: Only ProcessGrouppNCCL supports onCompletion hook, but got native backend.' (torch 2.13)"),
    Gap({"feature": "pending_works"},
        "c10d refuses _wait_for_pending_works for every backend but NCCL: 'RuntimeError: Only ProcessGrouppNCCL "
        "supports waitForPendingWorks, but got native backend.' (torch 2.13)"),
    Gap({"feature": "suspend_resume"},
        "native does not implement suspend/resume: c10d's default Backend::suspend() fails with 'RuntimeError: "
        "Backend native does not support suspend' (torch 2.13)"),
    Gap({"feature": "memory_stats"},
        "native keeps no memory statistics: c10d's default Backend::getMemoryStats() fails with 'RuntimeError: "
        "Backend native does not support getMemoryStats' (torch 2.13)"),
    Gap({"feature": "work_sequence_number"},
        "torch's ProcessGroup answers sequence numbers only for its built-in backends: "
        "group._get_sequence_number_for_group() fails with 'RuntimeError: ProcessGroup custom does not yet support "
        "sequence numbers.' before reaching a plugin backend (native counts them: "
        "group._get_backend(torch.device('cpu'))._get_sequence_number_for_group(); torch 2.13)",
        torch="<2.14"),  # torch 2.14.1 asks the backend: 24 cases XPASSed at ws2 and ws3
    SPLIT_NEEDS_ACCELERATOR,  # before the options gap below: a CPU split is refused before any options
    Gap({"clause": "test_pg_options_round_trip"},
        "torch 2.13 gives a plugin backend no options accessor: whatever pg_options a native group is made with "
        "(new_group, re-init of the default group, shrink_group), group._get_backend(cpu).options fails with "
        "\"AttributeError: 'torch._C._distributed_c10d.Backend' object has no attribute 'options'\" (native keeps "
        "the timeout: test_shrunk_group_times_out_as_its_options_say measures it)",
        unless_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    Gap({"clause": "test_pg_options_round_trip"},
        "under TORCH_DISTRIBUTED_DEBUG=DETAIL torch's _ProcessGroupWrapper answers with native's "
        "getBackendOptions(), which carries the timeout but no group name or ranks: 'the backend reports "
        "group_name '', c10d named it '1'' (new_group; the default group's '0' likewise), and shrink_group's "
        "group escapes the wrapper: \"AttributeError: 'torch._C._distributed_c10d.Backend' object has no "
        "attribute 'options'\" (torch 2.13)",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    Gap({"flight_recorder": FLIGHT_RECORDER_PARTS, "recorder": "torch"},
        "an out-of-tree C++ backend cannot record into torch 2.13's flight recorder: libtorch_cpu.so keeps "
        "FlightRecorder<c10::Event>::record() and the singleton get()::instance as local symbols, so an extension "
        "calling record() builds against FlightRecorder.hpp but fails to load ('undefined symbol: "
        "_ZN4c10d14FlightRecorderIN3c105EventEE6recordEm...'), and the definitions (FlightRecorderDetail.hpp) do "
        "not compile outside torch ('fatal error: nlohmann/json.hpp: No such file or directory'); even compiled, "
        "they would fill the extension's own recorder, which _dump_fr_trace never reads: native writes nothing "
        "into torch's (it keeps its own instead, native/recorder.hpp, registered through "
        "backends/flight_recorders.py by native/flight_recorder.py: the recorder=backend cases)",
        torch=">=2.11,<2.15"),
    Gap({"flight_recorder": "analyser", "recorder": "backend"},
        "torch's fr_trace refuses every entry of a communication library it does not list: on native's own "
        "recorder's dumps ('native:all_reduce') it fails with \"AssertionError: name formatting error? native not "
        "in {...}\" (Op.__init__ in torch/distributed/flight_recorder/components/types.py; torch 2.13 lists nccl, "
        "ncclx, xccl, gloo, rccl, rcclx, mccl and hccl); the copies a hang report keeps for fr_trace name those "
        "calls 'gloo:' (fixtures/fr_trace_input.py) and fr_trace then names the missing rank",
        torch=">=2.11,<2.15"),
    LOCAL_SYNC_DESYNCS_GROUP_NAMES,
    Gap({"feature": "concurrent_group_creation"},
        "native groups created from two threads at once over one store client deadlock until the store timeout: "
        "each rank's construction blocks in a store wait for its peers ('native/attached/<rank>'), and on a "
        "shared TCPStore client that wait holds the client against the other thread's writes (observed on "
        "torch 2.13, ws2-4: 'DistStoreError: wait timeout after 2000ms, keys: ...//cpu//native/attached/0', then "
        "\"rank 1 cannot open the group's segment ...: No such file or directory\"); with a store client per "
        "thread both groups are made at once"),
    # torch 2.14's fault-tolerance API, measured on torch 2.14.1 at ws2 and ws3 (the build needs C++20 there:
    # native/build.py for_torch): native implements none of it, so torch's base Backend refuses each call
    Gap({"feature": "reconfigure"},
        "native cannot reconfigure: its Backend's get_reconfigure_handle() fails with 'RuntimeError: Backend "
        "native does not support get_reconfigure_handle' (torch 2.14.1; supports_reconfigure is False)",
        torch=">=2.14"),
    Gap({"feature": "abort_hooks"},
        "native has no abort hooks: its Backend's register_abort_hook(id, hook) fails with 'RuntimeError: Backend "
        "native does not support registerAbortHook' (torch 2.14.1)", torch=">=2.14"),
)


def _creator(planted_bug: str):
    def create(dist_options, backend_options):
        extension = build.load()
        backend = extension.create(
            dist_options.store,
            dist_options.group_rank,
            dist_options.group_size,
            dist_options.timeout.total_seconds(),
            [int(r) for r in dist_options.global_ranks_in_group],
            planted_bug=planted_bug,
            group_name=dist_options.group_id,
            recorder_size=recorder_size(),  # read by the process's first group only, as torch reads its own
        )
        flight_recorder.register_recorder(extension)
        return backend
    return create


def _availability(planted_bug: str):
    def check() -> Availability:
        try:
            extension = build.load()
        except build.BuildFailed as exc:
            return Availability(False, str(exc))
        if planted_bug not in extension.PLANTED_BUGS:  # one reason here, not an error from every rank's create
            return Availability(False, f"native: unknown planted bug {planted_bug!r}; known: "
                                       f"{', '.join(repr(name) for name in extension.PLANTED_BUGS)}")
        return Availability(True)
    return check


# per live group and rank (suites/soak/test_resources.py, torch 2.13, ws2-4): one /dev/shm mapping and two
# threads, no descriptor (native/segment.cpp closes it once the segment is mapped)
RESOURCE_BUDGET = ResourceBudget(fds_fixed=0, threads_fixed=2)

# A timed-out collective breaks the group on every member (native/segment.cpp, SegmentHeader::timedOutRank):
# measured on torch 2.13 at ws2-4, every rank's next collective raises at once (0.00 s), the ranks that timed out
# with their own timeout, the one that had stayed away with the peer's
AFTER_TIMEOUT = AfterTimeout(usable=False, error=r"^RuntimeError: native: this group is unusable after an earlier "
                                                 r"failure: native: .*timed out")


def register(name: str = NAME, planted_bug: str = "none", gaps: tuple[Gap, ...] = GAPS,
             description: str = "") -> BackendSpec:
    """Register ``name`` as the native backend running with ``planted_bug`` ("none" is the real one).

    The bug is one of the extension's PLANTED_BUGS (native.hpp, PlantedBug),
    planted at run time for the whole process when a group is created; return
    the backend's spec.
    """
    if name.upper() not in dist.Backend._plugins:  # importing twice must not fail
        dist.Backend.register_backend(name, _creator(planted_bug), extended_api=True, devices=["cpu"])
    return BackendSpec(
        name=name,
        device_type="cpu",
        check_available=_availability(planted_bug),
        gaps=gaps,
        resource_budget=RESOURCE_BUDGET,
        after_timeout=AFTER_TIMEOUT,
        own_flight_recorder=flight_recorder.NAME,
        description=description or "C++ c10d Backend over shared memory (native/), built with "
                                   "torch.utils.cpp_extension",
    )


DISTCONFORM_SPEC = register()
