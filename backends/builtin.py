"""Specs of the backends torch ships: gloo, nccl, mpi, ucc.

The project's own backends (reference, native) declare theirs in their modules
(backends/registry.py PROJECT_BACKEND_MODULES).

Every gap below was observed on torch 2.13 (gloo, on this CPU machine) or is
documented by the backend's own code (nccl, mpi, ucc: the error text torch
raises is quoted where known). A gap is a finding, not an excuse: the case
still runs as a strict xfail so the report shows the backend's real error.
"""

from __future__ import annotations

from .spec import (LOCAL_SYNC_DESYNCS_GROUP_NAMES, MONITORED_BARRIER_GLOO_ONLY, SPLIT_NEEDS_ACCELERATOR, AfterTimeout,
                   Availability, BackendSpec, Gap, ResourceBudget)


def _gloo_available() -> Availability:
    import torch.distributed as dist

    if not dist.is_available():
        return Availability(False, "torch was built without torch.distributed")
    if not dist.is_gloo_available():
        return Availability(False, "torch was built without gloo")
    return Availability(True)


def _gloo_cuda_available() -> Availability:
    import torch

    gloo = _gloo_available()
    if not gloo.available:
        return gloo
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return Availability(False, "gloo-cuda needs a CUDA GPU and this machine has none")
    return Availability(True)


def _nccl_available() -> Availability:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return Availability(False, "torch was built without NCCL (CPU-only build)")
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return Availability(False, "nccl needs CUDA GPUs and this machine has none")
    return Availability(True)


def _mpi_available() -> Availability:
    import shutil

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_mpi_available():
        return Availability(False, "torch was built without MPI (mpi is only compiled in from source)")
    if shutil.which("mpirun") is None:
        return Availability(False, "mpi backend needs mpirun on PATH to launch ranks")
    return Availability(True)


def _ucc_available() -> Availability:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_ucc_available():
        return Availability(False, "torch was built without UCC")
    return Availability(True)


GLOO_GAPS: tuple[Gap, ...] = (
    Gap(
        {"feature": "send_to_self"},
        "gloo's tcp transport has no pair to itself: send/recv to the own rank fails with "
        "'enforce fail ... state_ >= CONNECTED' (torch 2.13)",
    ),
    Gap(
        {"layout": "non_contiguous", "collective": ("all_reduce", "reduce", "broadcast", "scatter", "reduce_scatter")},
        "gloo treats a strided (non-contiguous) view as if it were contiguous: all_reduce, reduce, broadcast, "
        "scatter and reduce_scatter read/write the first numel() elements of the underlying storage "
        "instead of the view's elements (observed on torch 2.13; all_gather and gather are correct)",
    ),
    Gap(
        {"layout": "non_contiguous", "collective": "all_to_all", "form": "single"},
        "gloo's all_to_all_single (even or uneven splits) rejects a strided (non-contiguous) input with "
        "'ValueError: Tensors must be contiguous', and writes into a strided output as if it were contiguous "
        "(the first numel() elements of its storage, clobbering the rest of the buffer) (torch 2.13; the list "
        "form is correct)",
    ),
    Gap(
        {"collective": "all_to_all", "form": "list", "split": "uneven"},
        "gloo's list-form alltoall requires every tensor to have the same size: "
        "'ProcessGroupGloo::alltoall: invalid tensor size' (use all_to_all_single with split sizes)",
    ),
    Gap(
        {"bad_input": ("all_reduce_mismatched_shapes", "all_reduce_mismatched_dtypes")},
        "gloo does not check that ranks agree on sizes/dtypes: a mismatch aborts a rank "
        "(uncaught gloo::EnforceNotMet 'Received data size doesn't match expected size', SIGABRT) "
        "or one rank returns silently while the others time out",
        consequence="kills_rank",
        # Under DETAIL torch wraps gloo in its ProcessGroupWrapper, which compares
        # every collective's fingerprint (shapes, dtypes) across ranks first and raises
        # on every rank: the gap does not hold there (suites/parallel/test_debug.py).
        unless_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    ),
    Gap(
        {"feature": "debug_wrapper", "collective": "send_recv"},
        "under TORCH_DISTRIBUTED_DEBUG=DETAIL a correct program fails: send/recv advance the group's sequence "
        "number on the two ranks taking part only, and torch 2.13's wrapper then rejects the next collective "
        "on every rank: 'Detected mismatch between collectives on ranks. Rank 0 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, ...), but Rank 2 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, ...). ... Sequence number: 1vs 0' "
        "(reproduced outside the harness with three processes)",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    ),
    Gap(
        {"work": "member_away"},
        "under TORCH_DISTRIBUTED_DEBUG=DETAIL torch's ProcessGroupWrapper checks every collective's fingerprint "
        "with a monitored barrier before handing it to gloo, even for async_op=True: a Work issued while a member "
        "is away blocks the caller until that member comes (the is_completed and wait(timeout) clauses run into "
        "the harness deadline), and a member that never comes fails with the wrapper's 'Ranks 1 failed to pass "
        "monitoredBarrier in 500 ms' instead of a Work carrying c10d's 'Timed out' error: not run, a hang costs "
        "the world",
        outcome="skip",
        consequence="hangs",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    ),
    Gap(
        {"feature": "ddp", "impl": "torch"},
        "torch 2.13's DistributedDataParallel constructor crashes with SIGSEGV under TORCH_DISTRIBUTED_DEBUG=DETAIL "
        "on gloo (in _ddp_init_helper, self.logger.set_construction_data_and_log, with the group wrapped in "
        "_ProcessGroupWrapper; reproduced outside the harness: two processes, DDP(nn.Linear(4, 2)), both exit "
        "-11; at OFF and INFO it constructs): not run, a crash kills the world",
        outcome="skip",
        consequence="kills_rank",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    ),
    Gap(
        {"bad_peer": ("send_to_world_size", "send_to_negative_rank", "recv_from_world_size")},
        "gloo does not validate p2p peer ranks: send/recv to rank world_size or -1 looks the rank up "
        "out of bounds in gloo::transport::tcp::Context::getPair, waits in the store for its address "
        "until the group timeout ('DistStoreError: wait timeout after ...ms'; on the default group it "
        "did not return within 300 s) and leaves the heap corrupt: the rank later aborts ('double free "
        "or corruption') or segfaults (torch 2.13)",
        consequence="kills_rank",
    ),
    Gap(
        {"feature": "recv_any_source", "shape": "empty"},
        "gloo cannot receive an empty tensor from any source: recv without src fails with "
        "'enforce fail at gloo/transport/tcp/unbound_buffer.cc:184 offset < this->size. 0 vs 0' "
        "(recv from a named source of an empty tensor works; torch 2.13)",
    ),
)

# gloo instantiates its collectives for these dtypes only (GENERATE_ALL_TYPES in ProcessGroupGloo.cpp);
# send/recv move raw bytes and take any dtype
GLOO_COLLECTIVE_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool")
GLOO_GAPS += (
    Gap(
        {"dtype": ("int16", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"),
         "collective": ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter",
                        "all_to_all")},
        "gloo's collectives exist for " + ", ".join(GLOO_COLLECTIVE_DTYPES) + " only: int16, uint16/32/64 and "
        "float8_e4m3fn/e5m2 fail in every collective, data-moving ones included, with 'RuntimeError: Invalid "
        "scalar type' (send/recv carry them; torch 2.13)",
    ),
    Gap(
        {"feature": "sparse", "dtype": ("complex64", "complex128")},
        "gloo's sparse all_reduce has no complex dtypes: the group's allreduce of a complex COO tensor fails with "
        "'RuntimeError: Invalid scalar type' (dense complex works; torch 2.13)",
    ),
    Gap(
        {"feature": "work_sequence_number", "collective": "reduce_scatter"},
        "gloo's list-form reduce_scatter advances the group's sequence number by the world size, not by one "
        "(observed on torch 2.13: 3 -> 5 at world size 2, 3 -> 6 at world size 3), so sequence numbers no longer "
        "count collectives after one",
    ),
    SPLIT_NEEDS_ACCELERATOR,
    Gap(
        {"feature": "shrinking"},
        "gloo cannot shrink a group: shrink_group fails with \"TypeError: Process group backend for '<name>' does "
        "not support shrinking operations.\" (Backend.supports_shrinking is False; torch 2.13 shrinks NCCL groups)",
    ),
    Gap(
        {"feature": "abort", "work": "pending_on_abort"},
        "gloo's abort leaves a pending Work pending: _abort_process_group(group) returns, but a wait() on an "
        "all_reduce still waiting for absent ranks does not end until the group's timeout (observed on torch 2.13: "
        "wait(timeout=3 s) raises 'Operation timed out!'; under load, 12 all_reduces in flight on 3 groups, "
        "_abort_process_group() returns in 0.02-0.03 s and all 12 end 3.1 s later with 'Operation timed out!', ws2 "
        "and ws3)",
    ),
    Gap(
        {"feature": "work_api", "work": "duration"},
        "gloo does not time collectives: after _enable_collectives_timing(), Work._get_duration() fails with "
        "'RuntimeError: This Backend doesn't support getDuration.' (torch 2.13; only NCCL records durations)",
    ),
    Gap(
        {"feature": "coalescing", "form": "device"},
        "gloo has no start/end coalescing: _coalescing_manager(device=...) fails with 'RuntimeError: Backend gloo "
        "does not implement startCoalescing' (without a device, c10d's *_coalesced fast paths work; torch 2.13)",
    ),
    Gap(
        {"feature": "premul_sum"},
        "gloo has no PREMUL_SUM: all_reduce/reduce/reduce_scatter with dist._make_nccl_premul_sum(f) fail with "
        "'RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo' (torch 2.13)",
    ),
    # torch's flight recorder (suites/c10d/test_flight_recorder.py): gloo records one entry per collective with the
    # right name, sizes, dtypes, group and agreed collective_seq_id; the rest is torch's ProcessGroupGloo, measured the
    # same on 2.11.0, 2.13 and 2.14.1 (2.14.1's pg_config gives the default group its ranks, still no new_group)
    Gap(
        {"flight_recorder": "collectives"},
        "under TORCH_DISTRIBUTED_DEBUG=DETAIL gloo's flight-recorder entries lose their group: the gloo backend "
        "inside torch's ProcessGroupWrapper never gets the group's name, so the user's all_reduce is filed under "
        "['', ''] beside the wrapper's own fingerprint all_gathers (same group, another sequence): '0 recorder "
        "entries name the group ['1', 'undefined'] ([])' (torch 2.13)",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        torch=">=2.11,<2.15",
    ),
    *(Gap({"flight_recorder": part}, reason, torch=">=2.11,<2.15") for part, reason in (
        ("p2p",
         "gloo records no flight-recorder entry for send/recv: after an isend and an irecv on a fresh group "
         "'0 recorder entries name the group ['2', 'undefined'] ([])' (the group's op_id still advances; "
         "torch 2.13)"),
        ("completion",
         "gloo's flight-recorder entries stay 'scheduled' after their Work completed: after wait() (and 2 s more) "
         "\"the entries' states are {'gloo:all_reduce': 'scheduled', 'gloo:broadcast': 'scheduled', "
         "'gloo:all_gather': 'scheduled'}\" (retired: true; torch 2.13)"),
        ("pg_status",
         "gloo never marks a collective started in the flight recorder's pg_status: after three waited "
         "collectives \"pg_status['4'] is {'last_completed_collective': '3', 'last_enqueued_collective': '3', "
         "'last_started_collective': '-1'}\" (torch 2.13)"),
        ("pg_config",
         "gloo's flight-recorder pg_config names the default group '' with no ranks and omits every new_group: "
         "\"pg_config has no group '5' as its entries name it ({'name': '5', 'desc': 'undefined', "
         "'ranks': '[0, 1]'}); it holds {'': {'desc': '', 'name': '', 'ranks': '[]'}}\" (the default group's "
         "entries say ['0', 'default_pg']; torch 2.13)"),
        ("analyser",
         "torch's fr_trace cannot read gloo's dumps: its pg_config lacks the groups the entries name, so "
         "build_collectives fails with 'KeyError: ('6', 0)' (pg_name = _pg_guids[(original_pg_name, "
         "first_rank)]) and a hang is never analysed; the default group is listed as '' while its entries say "
         "('0', 'default_pg'), so a hang's dumps fail with 'KeyError: ('0', 0)' too (torch 2.13; the copies a hang "
         "report keeps for fr_trace get the missing pg_config rows, fixtures/fr_trace_input.py, and fr_trace then "
         "names the missing rank)"),
    )),
    LOCAL_SYNC_DESYNCS_GROUP_NAMES,
    Gap(
        {"collective": "all_to_all", "form": "list"},
        "torch 2.11's ProcessGroupGloo has no list-form alltoall: dist.all_to_all fails with 'RuntimeError: Backend "
        "gloo does not support alltoall' (all_to_all_single works; torch 2.13 has it, 2.12 not checked)",
        torch="<2.13",
    ),
    Gap(
        {"clause": ("test_completed_work_reports_success_and_values", "test_failed_work_reports_its_error")},
        "torch 2.11's Work.exception() binding cannot convert what gloo's Work stores: 'TypeError: Unregistered type "
        ": std::__exception_ptr::exception_ptr' ('Unable to convert function return value to a Python type' on a "
        "completed Work; torch 2.13 returns None or the exception, 2.12 not checked)",
        torch="<2.13",
    ),
    Gap(
        {"feature": "concurrent_group_creation"},
        "gloo groups created from two threads at once over one store client deadlock until the store timeout: "
        "ProcessGroupGloo's constructor blocks in a store read for a peer's address, and on a shared TCPStore "
        "client that read holds the client, so the other thread cannot publish its own address (observed on "
        "torch 2.13, ws2 and ws3: 'DistStoreError: wait timeout after 2000ms, keys: ...//cpu//0/1'; with a "
        "store client per thread, store.clone(), both groups are made at once; the reference backend makes them "
        "over one client)",
    ),
)

# What a gloo group's backend offers beyond collectives (suites/c10d/test_capabilities.py), measured on torch 2.13
# at ws2 and ws3 (OFF, INFO, DETAIL): the options it was created with round-trip (timeout, group_desc), the old and
# new single-buffer method names agree; the rest is refused by the backend (or by c10d's ProcessGroup for it)
GLOO_GAPS += (
    Gap({"clause": "test_advertised_capability_works", "feature": ("coalescing", "time_estimate", "tensor_alloc")},
        "gloo does not advertise them: its Backend's supports_coalescing, supports_time_estimate and "
        "supports_tensor_alloc(cpu) are False (torch 2.13; the *_coalesced fast paths still work, "
        "start/end coalescing does not, see the coalescing gap)"),
    Gap({"feature": "completion_hook"},
        "gloo has no completion hooks: group._register_on_completion_hook(hook) fails with 'RuntimeError: Only "
        "ProcessGrouppNCCL supports onCompletion hook, but got gloo backend.' (torch 2.13)"),
    Gap({"feature": "pending_works"},
        "gloo cannot wait for its pending Works: group._wait_for_pending_works() fails with 'RuntimeError: Only "
        "ProcessGrouppNCCL supports waitForPendingWorks, but got gloo backend.' (torch 2.13)"),
    Gap({"feature": "suspend_resume"},
        "gloo cannot be suspended: its Backend's suspend() fails with 'RuntimeError: Backend gloo does not support "
        "suspend' (resume() likewise; torch 2.13)"),
    Gap({"feature": "memory_stats"},
        "gloo keeps no memory statistics: its Backend's memory_stats() fails with 'RuntimeError: Backend gloo does "
        "not support getMemoryStats' (torch 2.13)"),
)

NCCL_GAPS = (
    Gap({"op": ("band", "bor", "bxor")}, "NCCL has no bitwise reductions: 'Cannot use ReduceOp.BAND with NCCL'"),
    Gap({"feature": "recv_any_source"}, "NCCL cannot receive from any source (ProcessGroupNCCL has no recvAnysource)"),
    MONITORED_BARRIER_GLOO_ONLY,
    LOCAL_SYNC_DESYNCS_GROUP_NAMES,
)

MPI_GAPS = (
    MONITORED_BARRIER_GLOO_ONLY,
    Gap({"feature": "group_timeout"}, "ProcessGroupMPI ignores timeouts: a skipped collective blocks forever",
        outcome="skip", consequence="hangs"),
    Gap({"feature": "barrier_timeout"}, "ProcessGroupMPI ignores timeouts: a skipped barrier blocks forever",
        outcome="skip", consequence="hangs"),
    Gap({"collective": "reduce_scatter"}, "ProcessGroupMPI does not implement reduce_scatter"),
    LOCAL_SYNC_DESYNCS_GROUP_NAMES,
)

UCC_GAPS = (
    MONITORED_BARRIER_GLOO_ONLY,
    Gap({"feature": "recv_any_source"}, "ProcessGroupUCC does not implement recvAnysource"),
    LOCAL_SYNC_DESYNCS_GROUP_NAMES,
)


BUILTIN_SPECS: dict[str, BackendSpec] = {
    "gloo": BackendSpec(
        name="gloo",
        device_type="cpu",
        check_available=_gloo_available,
        gaps=GLOO_GAPS,
        description="Gloo over TCP, CPU tensors",
        # measured on torch 2.13 (suites/soak/test_resources.py): per live group and rank one listening
        # socket, a pair socket per peer and 3 more descriptors, 3 threads; freed when Python collects the
        # group, not by destroy_process_group(group) alone. About 168 groups fill 1024 descriptors at ws3.
        resource_budget=ResourceBudget(fds_fixed=4, fds_per_peer=1, threads_fixed=3),
        # measured on torch 2.13 at ws2 and ws3: a timeout closes the group's pairs; at once (0.00 s) the next
        # collective raises 'Application timeout caused pair closure' on the ranks that timed out and
        # 'Connection closed by peer [...]' on the rank that had stayed away
        after_timeout=AfterTimeout(usable=False,
                                   error=r"Application timeout caused pair closure|Connection closed by peer"),
    ),
    "nccl": BackendSpec(
        name="nccl",
        device_type="cuda",
        check_available=_nccl_available,
        # Blocking wait makes a timed-out collective raise in the calling thread,
        # which is what the timeout clauses check; without it NCCL's watchdog
        # aborts the process asynchronously.
        rank_env={"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
        gaps=NCCL_GAPS,
        description="NCCL on CUDA devices, rank r on cuda:r",
    ),
    # torch's gloo with the ranks' tensors on CUDA: the device-placement paths of the harness and of every
    # clause with more ranks than this machine has GPUs (gloo stages CUDA tensors through host memory, so
    # ranks may share a GPU; ids say gloo-cuda). Gloo's gaps hold (inherited); not checked on a GPU yet.
    "gloo-cuda": BackendSpec(
        name="gloo-cuda",
        device_type="cuda",
        torch_backend="gloo",
        shares_devices=True,
        check_available=_gloo_cuda_available,
        inherits="gloo",
        description="gloo with CUDA tensors; ranks share GPUs (rank r on cuda:r mod GPU count)",
    ),
    "mpi": BackendSpec(
        name="mpi",
        device_type="cpu",
        check_available=_mpi_available,
        launcher=("mpirun", "--oversubscribe", "-np", "{world_size}"),
        gaps=MPI_GAPS,
        description="MPI; ranks are launched by mpirun",
    ),
    "ucc": BackendSpec(
        name="ucc",
        device_type="cpu",
        check_available=_ucc_available,
        gaps=UCC_GAPS,
        description="UCC collectives, CPU tensors",
    ),
}
