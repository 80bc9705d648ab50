"""Specs of the backends torch ships: gloo, nccl, mpi, ucc.

The project's own backends (reference, native) declare theirs in their modules
(backends/registry.py PROJECT_BACKEND_MODULES).

Every gap below was observed on torch 2.13 (gloo, on this CPU machine) or is
documented by the backend's own code (nccl, mpi, ucc: the error text torch
raises is quoted where known). A gap is a finding, not an excuse: the case
still runs as a strict xfail so the report shows the backend's real error.
"""

from __future__ import annotations

from .spec import (LOCAL_SYNC_DESYNCS_GROUP_NAMES, MONITORED_BARRIER_GLOO_ONLY, SPLIT_NEEDS_ACCELERATOR,
                   SPLIT_NEEDS_EAGER_INIT, TCPSTORE_GET_UNBOUNDED, AfterTimeout, Availability, BackendSpec,
                   ErrorsAfterFaults, Gap, ResourceBudget)


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


def _nccl2_available() -> Availability:
    import torch

    if not hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL2"):
        return Availability(False, f"torch {torch.__version__} has no nccl2 (ProcessGroupNCCL2, NCCL on the "
                                   "torchcomms engine, is in torch 2.14 on, where NCCL is built)")
    return _nccl_available()


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
        {"layout": "non_contiguous", "collective": ("all_reduce", "reduce", "broadcast", "reduce_scatter")},
        "gloo treats a strided (non-contiguous) view as if it were contiguous: all_reduce, reduce, broadcast "
        "and reduce_scatter read/write the first numel() elements of the underlying storage "
        "instead of the view's elements (observed on torch 2.13; all_gather and gather are correct; a world of "
        "one copies the view correctly)",
        min_world_size=2,
    ),
    Gap(
        {"layout": "non_contiguous", "collective": "scatter"},
        "gloo's scatter into a strided (non-contiguous) view writes the first numel() elements of its storage "
        "instead of the view's, at every world size: 'scatter from 0 on rank 0: 6 of 12 elements wrong; first at "
        "flat index 6: got 0.0, expected 6.0' (world size 1, torch 2.13)",
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
        "'ProcessGroupGloo::alltoall: invalid tensor size' (use all_to_all_single with split sizes; a world of "
        "one has a single tensor and passes)",
        min_world_size=2,
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
        {"feature": "work_sequence_number", "collective": "reduce_scatter", "form": "list"},
        "gloo's list-form reduce_scatter advances the group's sequence number by the world size, not by one "
        "(observed on torch 2.13: 3 -> 5 at world size 2, 3 -> 6 at world size 3), so sequence numbers no longer "
        "count collectives after one (at world size 1, +1 is right)",
        min_world_size=2,
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
        "over one client; a world of one waits for no peer)",
        min_world_size=2,
    ),
)

# What a gloo group's backend offers beyond collectives (suites/c10d/test_capabilities.py), measured on torch 2.13
# at ws2 and ws3 (OFF, INFO, DETAIL): the options it was created with round-trip (timeout, group_desc), the old and
# new single-buffer method names agree; the rest is refused by the backend (or by c10d's ProcessGroup for it)
GLOO_GAPS += (
    # measured on torch 2.13 on simulated hosts (suites/faults, docs/faults.md): a silent partition ends gloo's
    # collective at its timeout with its transport's words only; a reset names the peer's address
    Gap({"clause": "test_the_error_names_the_operation_or_the_peer", "fault": ("partition", "one_way", "flap",
                                                                                "data_plane", "frozen"),
         "operation": ("all_reduce", "barrier")},
        "gloo's error under a silent partition names neither the collective nor the peer: "
        "'[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete' (or "
        "'unbound_buffer.cc:129] ... for send operation'), for an all_reduce and a barrier alike (a p2p's 'recv "
        "operation' names it); only a reset names the peer ('Connection closed by peer [127.77.0.2]:<port>')"),
    TCPSTORE_GET_UNBOUNDED,
    Gap({"clause": "test_a_reset_fails_at_once_on_the_reset_host_and_a_peer", "operation": "p2p",
         "fault": "cut_after_bytes"},
        "gloo's p2p on a connection cut after 256 KiB waits for its timeout on both ranks instead of failing at "
        "once: the sender '[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 2000ms for send operation "
        "to complete', the receiver '[...unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to "
        "complete' (2.00 s and 2.01 s, ws2 and ws3; the all_reduce on the same host is reset at once: 'Connection "
        "closed by peer')"),
    Gap({"clause": "test_the_first_collective_ends_within_its_timeout",
         "fault": ("partition", "refused", "one_way", "flap", "data_plane")},
        "gloo's first collective under TORCH_GLOO_LAZY_INIT=1, the host partitioned before the first connection, "
        "is not bounded by the group's 2 s timeout: the ranks that can reach the store raise after 10.00 s, five "
        "times it ('[gloo/transport/tcp/pair.h:311] Connect timeout [127.77.0.2]:<port>'), and the cut-off rank "
        "was still running after 12 s (ws2 and ws3; pytorch/gloo#520, fixed upstream after torch 2.14). Every "
        "other fault before the first connection alike (ws2 and ws3, one run each): refused connections, the "
        "backend's connections alone dropped (data_plane), one direction dropped and the link down, 'Connect timeout "
        "[none]' after 10.01-10.02 s on the ranks that raised; under one_way and flap the cut-off rank was still "
        "running after 12 s (gloo retries a refused connect until its connect timeout, 5 times the group's)"),
    Gap({"clause": "test_the_group_ends_after_its_first_collective_failed", "fault": "cut_after_bytes"},
        "gloo's lazily connected group (TORCH_GLOO_LAZY_INIT=1) whose first all_reduce had its connections cut after "
        "256 KiB does not always end: the all_reduce raises at once on every rank ('[gloo/transport/tcp/pair.cc:537] "
        "Read error [127.77.0.3]:<port>: Connection reset by peer' or '[...pair.cc:553] Connection closed by peer', "
        "0.02-2.04 s) and destroy_process_group returns at once, but dropping the group's last reference "
        "(~ProcessGroupGloo) was still running after 12 s on one rank (rank 0 or 2) in 7 of 10 runs at 3 ranks; at 2 "
        "ranks it ended every time (torch 2.13). Left alone it outlived the world's 60 s deadline",
        outcome="intermittent", min_world_size=3),
    Gap({"clause": "test_the_error_names_the_operation_or_the_peer", "fault": ("refused", "cut_after_bytes")},
        "gloo at 3 ranks: when the last rank's host resets its connections (refused, or cut after 256 KiB), a rank "
        "that is not its ring neighbour may wait for its timeout "
        "and raise '[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
        "2000ms for recv operation to complete', naming neither the collective nor the peer (the others: "
        "'Connection closed by peer [127.77.0.3]:<port>'). Which of the two rank 0 gets depends on whether its "
        "side of the ring touched the reset host before giving up (seen both ways in two default runs)",
        min_world_size=3, outcome="intermittent"),
    Gap({"clause": "test_a_reset_fails_at_once_on_the_reset_host_and_a_peer", "fault": "cut_after_bytes",
         "operation": "all_reduce"},
        "gloo at 3 ranks, an all_reduce of 48 MiB whose connections on the last rank's host are reset after "
        "256 KiB: the reset host raised at once, but both its peers waited for their timeout ('seconds by rank "
        "{0: 2.09, 1: 2.09, 2: 0.05}', torch 2.14.1, 2026-12-03); in the other runs that day (torch 2.13 and "
        "2.14.1) a peer raised at once too. Whether a peer notices depends on whether its side of the ring was "
        "on the reset connection when the reset came", min_world_size=3, outcome="intermittent"),
    Gap({"clause": "test_advertised_capability_works", "feature": ("coalescing", "time_estimate", "tensor_alloc")},
        "gloo does not advertise them: its Backend's supports_coalescing, supports_time_estimate and "
        "supports_tensor_alloc(cpu) are False (torch 2.13; the *_coalesced fast paths still work, "
        "start/end coalescing does not, see the coalescing gap)"),
    Gap({"clause": "test_a_uuid_reused_by_the_whole_group_is_refused"},
        "gloo refuses a uuid the whole group reuses on rank 0 only (torch 2.14.1, ws3, "
        "suites/c10d/fault_tolerance_measure.py refusals_after_reconfigure): rank 0 raises 'Gloo reconfigure uuid "
        "1100 was already used; each reconfigure() requires a unique uuid', rank 2 accepts it and rank 1 blocks "
        "until 'Gloo connectFullMesh failed with [...pair.h:311] Connect timeout [none]' (60 s); the group is "
        "then broken ('Connection closed by peer'). PyTorch's test reuses the uuid of a rank alone only",
        outcome="skip", consequence="hangs", torch=">=2.14"),
    Gap({"feature": "abort_hooks"},
        "gloo has no abort hooks: its Backend's register_abort_hook(id, hook) fails with 'RuntimeError: Backend gloo "
        "does not support registerAbortHook' (unregister_abort_hook: 'unregisterAbortHook'; torch 2.14.1, "
        "suites/c10d/fault_tolerance_measure.py)", torch=">=2.14"),
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
    # suites/c10d/test_shrink_and_options.py, measured on torch 2.13 at ws2 and ws3
    Gap({"feature": "pg_options"},
        "gloo drops the pg_options a group is made with: torch 2.13 builds ProcessGroupGloo(store, rank, size, "
        "timeout=...) without them (new_group and init_process_group alike), so a group made with "
        "ProcessGroupGloo._Options(_threads=3) reports 'the backend reports _threads=2, the group was made with 3' "
        "(its timeout comes from timeout=, which is kept)"),
    # torch's gloo, not the clause: the same merge without the harness (spawned processes, each merging its own
    # one-rank group over one TCPStore with size n, as torch's own test_remote_group_merge does at ws2) failed alike
    # on torch 2.13 under load: ws2 1 run in 8, ws3 1 in 14 with new_group's groups and 2 in 10 with split_group's;
    # torch 2.14.1 merged in all 18 runs tried (10 suite cases at ws2 and ws3, 8 standalone at ws3)
    Gap({"feature": "merge_remote_group"},
        "gloo's merge_remote_group loses a connection in some runs (torch 2.11 and 2.13, at ws2, ws3 and ws4; "
        "2.14.1 merged every time): one rank's connectFullMesh waits as the listening side of a pair for a peer that "
        "already counts itself connected, until 5 x the merge's timeout ('Gloo connectFullMesh failed with "
        "[gloo/transport/tcp/pair.h:311] Connect timeout [none]' after 15 s for 3 s: gloo's "
        "Device::connectAsListener takes no timeout), while its peers' first collective on the merged group fails "
        "with 'Timed out waiting 3000ms for recv operation to complete'. Seen on torch 2.13 at ws3 in 5 of 7 suite "
        "runs, at ws2 in 2 of 7, at ws4 in 3 of 3; torch 2.11 at ws3 in 2 of 3, at ws2 in 0 of 3 (with the "
        "merge's old 13 s timeout the listener's 65 s wait outlived the 30 s harness deadline: the world hung)",
        outcome="intermittent", torch="<2.14"),
)

# Measured on one NVIDIA H200 with torch 2.11.0+cu130 and NCCL 2.28.9 at world size 1 (python -m fixtures.gpu_check,
# the only size one GPU allows). What ProcessGroupNCCL documents or refuses by design holds on every release; what
# looks like a torch defect is gated to the release it was seen on (2.12+ with CUDA not measured yet).
NCCL_ALL_COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter",
                        "all_to_all")
NCCL_GAPS = (
    Gap({"op": ("band", "bor", "bxor")}, "NCCL has no bitwise reductions: 'Cannot use ReduceOp.BAND with NCCL'"),
    Gap({"feature": "recv_any_source"}, "NCCL cannot receive from any source (ProcessGroupNCCL has no recvAnysource)"),
    MONITORED_BARRIER_GLOO_ONLY,
    LOCAL_SYNC_DESYNCS_GROUP_NAMES,
    SPLIT_NEEDS_EAGER_INIT,  # --init lazy (the default) gives no device_id (fixtures/devices.py)
    Gap({"dtype": ("int16", "uint16", "uint32", "uint64"),
         "collective": ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")},
        "ProcessGroupNCCL maps no NCCL type to int16, uint16, uint32 or uint64: 'TypeError: Input tensor data type "
        "is not supported for NCCL process group: Short' (UInt16, UInt32, UInt64 likewise; torch 2.11, H200)"),
    # all_to_all and gather are send/recv inside an NCCL group: the dtype is refused between ncclGroupStart and
    # ncclGroupEnd, and the process's NCCL then fails every later collective (below)
    Gap({"dtype": ("int16", "uint16", "uint32", "uint64"), "collective": ("all_to_all", "gather")},
        "all_to_all and gather of int16, uint16, uint32 or uint64 on NCCL fail with 'RuntimeError: Unconvertible "
        "NCCL type Short' (UInt16, ... likewise), thrown inside an NCCL group call, and the process's NCCL stays "
        "broken: in the two full H200 runs every later collective of that worker's world failed with "
        "'DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3780, invalid argument' (int8 all_reduce, DDP's "
        "construction, a float all_reduce with a future), while in a world that never ran these they all passed "
        "(torch 2.11, NCCL 2.28.9; the mechanism is inferred from that, not traced)",
        consequence="breaks_backend"),
    Gap({"dtype": ("uint16", "uint32", "uint64"), "collective": "scatter"},
        "NCCL's scatter of uint16, uint32 or uint64 returned without error and left the output unwritten in one of "
        "two whole-suite H200 runs: 'scatter of uint32 on rank 0 (entry 0): element 0 has bytes [0, 0, 0, 0], "
        "expected [0, 0, 0, 136]'; in the other all three were exact (int16 is scattered exactly in both; torch "
        "2.11, world size 1, 8 pytest workers)", torch="<2.12", outcome="intermittent"),
    Gap({"dtype": ("complex64", "complex128"), "op": ("max", "min"), "collective": "reduce_scatter"},
        "NCCL's reduce_scatter of complex tensors with MAX returns instead of raising ('reduce_scatter_tensor MAX of "
        "complex tensors returned instead of raising'; all_reduce and reduce raise as torch's supports_complex "
        "says; torch 2.11, H200)", torch="<2.12"),
    Gap({"feature": "premul_sum", "collective": "reduce_scatter"},
        "NCCL's reduce_scatter ignores the PREMUL_SUM factor: 'reduce_scatter_tensor PREMUL_SUM(0.25 as a float) "
        "float32 on rank 0 (chunk 0): 7 of 7 elements wrong; first at flat index 0: got 1.0000152587890625, expected "
        "0.2500038146972656' (all_reduce and reduce apply it; torch 2.11, H200, world size 1)", torch="<2.12"),
    Gap({"bad_input": "all_to_all_mismatched_splits"},
        "NCCL does not check all_to_all split sizes: rank 0 expecting 3 elements from each sender that sends 2 gets "
        "'all_to_all_mismatched_splits: no error on rank(s) [0]: {0: 'returned [1.0, 1.0, 0.0]'}' (torch 2.11, "
        "H200, world size 1; more ranks not measured)", torch="<2.12"),
    Gap({"feature": "sparse"},
        "NCCL has no sparse all_reduce: 'RuntimeError: NCCL does not support all_reduce with sparse tensors. Please "
        "use dense tensors instead.'"),
    Gap({"layout": "non_contiguous", "collective": tuple(c for c in NCCL_ALL_COLLECTIVES if c != "scatter")},
        "ProcessGroupNCCL takes contiguous tensors only: a strided view fails with 'ValueError: Tensors must be "
        "contiguous' (c10d does not copy it for the backend; scatter into a strided view is exact)"),
    Gap({"clause": "test_all_gather_coalesced"},
        "ProcessGroupNCCL has no list-form all_gather_coalesced: 'NotImplementedError: ProcessGroupNCCL does not "
        "support allgather_coalesced' (all_gather_into_tensor inside _coalescing_manager works)"),
    Gap({"entry_point": "all_gather_coalesced"},
        "ProcessGroupNCCL has no list-form all_gather_coalesced: 'dist.all_gather_coalesced failed on rank 0 of "
        "backend nccl: NotImplementedError: ProcessGroupNCCL does not support allgather_coalesced'"),
    Gap({"clause": "test_completed_work_reports_success_and_values"},
        "WorkNCCL refuses is_success(): 'NotImplementedError: WorkNCCL::isSuccess() is deprecated' (torch 2.11)"),
    Gap({"feature": "completion_hook"},
        "ProcessGroupNCCL's completion hooks need timing events: _register_on_completion_hook fails with "
        "'ValueError: ProcessGroupNCCL OnCompletion hook requires recording start and end events which require "
        "setting TORCH_NCCL_ENABLE_TIMING environment variable.' (torch 2.11)",
        unless_env={"TORCH_NCCL_ENABLE_TIMING": "1"}),
    Gap({"feature": "pending_works"},
        "ProcessGroupNCCL's _wait_for_pending_works returned before the Works completed in one of two H200 runs: "
        "'after _wait_for_pending_works the Works' is_completed() are [True, False, False]' (under 8 pytest "
        "workers; alone it passed; torch 2.11, world size 1)", torch="<2.12", outcome="intermittent"),
    Gap({"flight_recorder": "pg_config"},
        "NCCL's flight recorder does not give the default group its ranks: its pg_config held '0' with ranks '[]' "
        "in one H200 run and had no '0' at all in another (\"pg_config has no group '0' as its entries name it "
        "({'name': '0', 'desc': 'default_pg', 'ranks': '[0]'})\"; new groups are listed with their ranks; torch "
        "2.11, lazy init)", torch="<2.12"),
    Gap({"flight_recorder": "pg_status"},
        "NCCL's flight recorder leaves a group's pg_status at -1: \"pg_status['3'] is {'last_completed_collective': "
        "'-1', 'last_enqueued_collective': '-1', 'last_started_collective': '-1'}\" after three waited collectives "
        "whose entries it holds (torch 2.11, H200, TORCH_NCCL_ENABLE_TIMING not set)", torch="<2.12"),
    Gap({"feature": "suspend_resume"},
        "torch 2.11's ProcessGroupNCCL has no suspend(): 'AttributeError: 'ProcessGroupNCCL' object has no "
        "attribute 'suspend''", torch="<2.12"),
    Gap({"feature": "memory_stats"},
        "torch 2.11's ProcessGroupNCCL has no memory_stats(): 'AttributeError: 'ProcessGroupNCCL' object has no "
        "attribute 'memory_stats''", torch="<2.12"),
    Gap({"clause": "test_advertised_capability_works", "feature": "tensor_alloc"},
        "ProcessGroupNCCL does not advertise tensor allocation: supports_tensor_alloc(cuda) is False (torch 2.11, "
        "NCCL 2.28.9)", torch="<2.12"),
    Gap({"clause": "test_advertised_capability_works", "feature": "time_estimate"},
        "ProcessGroupNCCL advertises supports_time_estimate but estimates -1.0 ('supports_time_estimate=True, but "
        "using it failed: AssertionError: estimated time -1.0'; torch 2.11, H200, world size 1)", torch="<2.12"),
)

# gloo with CUDA tensors, measured on one NVIDIA H200 with torch 2.11.0+cu130, ranks sharing the GPU at world sizes
# 2 and 3 (python -m fixtures.gpu_check). Gloo's own gaps are inherited; these are what CUDA tensors add. The crashes
# are skipped (running them kills a rank, and a respawned CUDA world costs seconds) and gated to the release seen.
GLOO_CUDA_GAPS = (
    Gap({"collective": ("send_recv", "batch_isend_irecv")},
        "gloo's send/recv take CPU tensors only (PyTorch's backend table: gloo send/recv on GPU, no): with a CUDA "
        "tensor its TCP transport writes the device pointer and the rank aborts: 'gloo::IoException: "
        "[gloo/transport/tcp/pair.cc:339] writev [127.0.0.1]:19844: Bad address' (the peer then sees 'Connection "
        "closed by peer'; torch 2.11)", outcome="skip", consequence="kills_rank"),
    Gap({"feature": "subgroups"},
        "under --init eager torch 2.11's new_group asks a non-member's parent backend to take part in a split: "
        "'AttributeError: 'torch._C._distributed_c10d.ProcessGroupGloo' object has no attribute "
        "'perform_nocolor_split'' (the default group is bound to a device and ProcessGroupGloo advertises "
        "supports_splitting; torch 2.11, H200)", env={"DISTCONFORM_INIT": "eager"}, torch="<2.12"),
    Gap({"feature": "coalescing", "collective": "all_reduce"},
        "gloo has no CUDA all_reduce_coalesced: 'RuntimeError: ProcessGroupGloo::allreduce_coalesced: unsupported "
        "device type cuda' (all_reduce_coalesced and _coalescing_manager's all_reduce; torch 2.11)"),
    Gap({"feature": "coalescing", "collective": "all_gather"},
        "gloo's coalesced all_gather of CUDA tensors kills the rank: all_gather_coalesced and all_gather_into_tensor "
        "inside _coalescing_manager end in 'rank 0 died (killed by signal 11 (SIGSEGV))' (a single "
        "all_gather_into_tensor works; torch 2.11)", outcome="skip", consequence="kills_rank", torch="<2.12"),
    Gap({"form": "functional", "collective": "all_gather"},
        "functional all_gather (all_gather_into_tensor_coalesced underneath) of CUDA tensors on gloo kills the rank: "
        "test_funcol_all_gather ends in 'rank 0 died (killed by signal 11 (SIGSEGV))' (the functional reduce_scatter "
        "works; torch 2.11)", outcome="skip", consequence="kills_rank", torch="<2.12"),
    Gap({"form": "dtensor", "collective": ("all_gather", "reduce_scatter")},
        "DTensor redistributions that gather or reduce-scatter CUDA tensors on gloo kill the rank: "
        "test_redistribute shard_to_replicate, shard0_to_shard1, uneven_shard_to_replicate and partial_to_shard, "
        "and test_sharded_matmul colwise, end in 'rank 0 died (killed by signal 11 (SIGSEGV))' (partial_to_replicate "
        "and rowwise, all_reduces, work; torch 2.11)",
        outcome="skip", consequence="kills_rank", torch="<2.12"),
    Gap({"form": "functional", "feature": ("autograd", "async_work")},
        "the functional collectives' backward and in-flight clauses gather CUDA tensors on gloo, which kills the "
        "rank: test_funcol_backward[all_gather, reduce_scatter] and test_funcol_wait_tensor_in_flight end in "
        "'rank 0 died (killed by signal 11 (SIGSEGV))' (backward of all_reduce and all_to_all works, and is "
        "skipped with them; torch 2.11)", outcome="skip", consequence="kills_rank", torch="<2.12"),
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
        # measured on torch 2.14.1 at ws3 (suites/c10d/fault_tolerance_measure.py): gloo never reports an error;
        # after abort() its group even reduces again (torch's own test expects SUCCESS after abort on gloo); nor
        # after its all_reduce failed on a reset ('Connection closed by peer', 'Read error ... Connection reset by
        # peer') at ws2 and ws3, the last or a middle rank's host refusing (suites/faults/test_partition_recovery.py)
        errors_after_faults=ErrorsAfterFaults(after_abort="SUCCESS", after_timeout="SUCCESS", after_reset="SUCCESS"),
        # read when a group is made (ProcessGroupGloo's options); its pairs then connect at their first use
        lazy_connect_env={"TORCH_GLOO_LAZY_INIT": "1"},
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
        # a group made without device_id (--init lazy) makes its communicator at its first collective
        lazy_connect_env={},
    ),
    # torch 2.14's second NCCL backend ("nccl2": ProcessGroupNCCL2, on the torchcomms engine), the one torch 2.14's
    # fault-tolerance API (reconfigure, get_error) was written with (torch's test_c10d_fault_tolerance.py). Not
    # measured yet (no GPU has run it with torch 2.14): it declares no gaps, so its first GPU run
    # (python -m fixtures.gpu_check, step "fault-tolerance") holds it to torch's own expectations.
    "nccl2": BackendSpec(
        name="nccl2",
        device_type="cuda",
        check_available=_nccl2_available,
        rank_env={"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
        description="torch 2.14's nccl2 (ProcessGroupNCCL2) on CUDA devices, rank r on cuda:r",
        lazy_connect_env={},
    ),
    # torch's gloo with the ranks' tensors on CUDA: the device-placement paths of the harness and of every
    # clause with more ranks than this machine has GPUs (gloo stages CUDA tensors through host memory, so
    # ranks may share a GPU; ids say gloo-cuda). Gloo's gaps hold (inherited), GLOO_CUDA_GAPS add what CUDA tensors
    # break (measured on an H200, torch 2.11).
    "gloo-cuda": BackendSpec(
        name="gloo-cuda",
        device_type="cuda",
        torch_backend="gloo",
        shares_devices=True,
        check_available=_gloo_cuda_available,
        gaps=GLOO_CUDA_GAPS,
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
