"""The reference backend: a c10d process group in plain Python, registered as ``reference``.

Importing this package registers it, so it works with plain torch.distributed
outside the suite too::

    import backends.reference
    dist.init_process_group("reference", store=store, rank=rank, world_size=n)
    dist.all_reduce(t)

Read it as the spec: semantics.py says what every collective means,
process_group.py how ranks agree and exchange data, transport.py and wire.py
how bytes move between them, flight_recorder.py what it records of every call
for hang reports (torch's flight-recorder entries, in a recorder of its own).
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from backends.spec import (FLIGHT_RECORDER_PARTS, LOCAL_SYNC_DESYNCS_GROUP_NAMES, MONITORED_BARRIER_GLOO_ONLY,
                           PYTHON_PROCESS_GROUP_TAKES_EVERY_DEVICE,
                           SPLIT_NEEDS_ACCELERATOR, TCPSTORE_GET_UNBOUNDED, AfterTimeout, Availability, BackendSpec,
                           ErrorsAfterFaults, Gap,
                           ResourceBudget)

from . import backend_form
from . import flight_recorder as reference_recorder
from .process_group import LAZY_INIT_ENV, ReferenceProcessGroup

NAME = "reference"


def creator(group_class: type = ReferenceProcessGroup):
    """The creator torch calls for a group of ``group_class`` (the reference, or a subclass planting a bug)."""

    def create(dist_options, backend_options):
        """The group torch asked for: the ReferenceProcessGroup itself, which becomes the whole group; from torch
        2.14 on, where the string names other backends beside it, a c10d Backend of it (backend_form.py), which
        torch registers for the device the string names it for."""
        group = group_class(
            dist_options.store,
            dist_options.group_rank,
            dist_options.group_size,
            dist_options.timeout,
            global_ranks=list(dist_options.global_ranks_in_group) or None,
            enable_reconfigure=getattr(dist_options, "enable_reconfigure", False),  # torch 2.14 passes it
        )
        if backend_form.AVAILABLE and backend_form.names_other_backends():
            return backend_form.ReferenceBackend(group)
        return group

    return create


if NAME.upper() not in dist.Backend._plugins:  # importing twice must not fail
    dist.Backend.register_backend(NAME, creator(), extended_api=True, devices=["cpu"])


DISTCONFORM_SPEC = BackendSpec(
    name=NAME,
    device_type="cpu",
    own_flight_recorder=reference_recorder.PREFIX,
    check_available=lambda: Availability(True),
    gaps=(
        # measured on torch 2.13 (suites/c10d/test_capabilities.py); listed first so these reasons are the ones shown
        Gap({"clause": "test_advertised_capability_works",
             "feature": ("splitting", "coalescing", "time_estimate", "tensor_alloc")},
            "a Python ProcessGroup has no c10d Backend flags: the reference (its own backend: _get_backend(cpu) "
            "answers the group) has no supports_splitting, supports_coalescing, supports_time_estimate or "
            "supports_tensor_alloc attribute, so it advertises none of them (it does coalesce; it does not "
            "advertise supports_coalescing because torch 2.14's batch_isend_irecv would then take the C++ "
            "coalescing path)"),
        Gap({"clause": "test_advertised_capability_works", "feature": "shrinking"},
            "the reference advertises supports_shrinking False before torch 2.14: torch's shrink_group takes a C++ "
            "Backend back from shrink(), which Python cannot subclass there ('No constructor defined!')",
            torch="<2.14"),
        Gap({"feature": ("suspend_resume", "memory_stats")},
            "the reference has no suspend/resume and keeps no memory statistics: "
            "\"AttributeError: 'ReferenceProcessGroup' object has no attribute 'suspend'\" ('memory_stats' likewise)"),
        MONITORED_BARRIER_GLOO_ONLY,
        SPLIT_NEEDS_ACCELERATOR,
        Gap({"feature": "shrinking"},
            "the reference cannot shrink a group before torch 2.14: shrink_group registers what the group's device "
            "backend (the group itself, _get_backend(cpu)) returns from shrink() as a C++ Backend, which Python "
            "cannot subclass there ('No constructor defined!'), so it answers supports_shrinking False and "
            "shrink_group fails with \"TypeError: Process group backend for '<name>' does not support shrinking "
            "operations.\" (measured by test_shrink_group and test_shrink_after_a_rank_died; from 2.14 on it "
            "shrinks, backends/reference/backend_form.py)", torch="<2.14"),
        Gap({"flight_recorder": FLIGHT_RECORDER_PARTS, "recorder": "torch"},
            "a backend written in Python cannot record into torch's flight recorder: torch 2.13 records from C++ "
            "only (FlightRecorder<c10::Event>::record, called by ProcessGroupGloo/NCCL themselves), "
            "torch._C._distributed_c10d binds only _dump_fr_trace and _dump_fr_trace_json, and c10d's "
            "ProcessGroup records nothing for a Python subclass: '0 recorder entries name the group "
            "['1', 'undefined'] ([])', and pg_config and pg_status stay empty (the reference keeps its own "
            "recorder instead, backends/reference/flight_recorder.py, registered through "
            "backends/flight_recorders.py: the recorder=backend cases)",
            torch=">=2.11,<2.15"),
        Gap({"flight_recorder": "analyser", "recorder": "backend"},
            "torch's fr_trace refuses every entry of a communication library it does not list: on the reference's "
            "own recorder's dumps ('reference:all_reduce') it fails with \"AssertionError: name formatting error? "
            "reference not in {...}\" (Op.__init__ in torch/distributed/flight_recorder/components/types.py; torch "
            "2.13 lists nccl, ncclx, xccl, gloo, rccl, rcclx, mccl and hccl, earlier releases fewer); "
            "the copies a hang report keeps for fr_trace name those calls 'gloo:' (fixtures/fr_trace_input.py) "
            "and fr_trace then names the missing rank",
            torch=">=2.11,<2.15"),
        LOCAL_SYNC_DESYNCS_GROUP_NAMES,
        dataclasses.replace(
            PYTHON_PROCESS_GROUP_TAKES_EVERY_DEVICE, torch="<2.14",
            reason=PYTHON_PROCESS_GROUP_TAKES_EVERY_DEVICE.reason + "; the reference is one before torch 2.14, and "
            "answers a mixed string with a c10d Backend from 2.14 on (backend_form.py)"),
        TCPSTORE_GET_UNBOUNDED,  # the store is torch's (suites/faults, store_get)
        Gap({"feature": "premul_sum"},
            "torch 2.11's ReduceOp binding does not expose a PREMUL_SUM op's factor to Python (no ReduceOp.factor; "
            "torch 2.13 has it, 2.12 not checked): a Python process group cannot know what to multiply by",
            torch="<2.13"),
    ),
    # torch 2.14 on: a string naming other backends too gets the reference's c10d Backend form (backend_form.py);
    # measured with cpu:reference,cuda:gloo on torch 2.14.1 at ws2 (c10d and p2p)
    gaps_beside_other_backends=(
        Gap({"clause": ("test_completed_work_reports_success_and_values", "test_work_not_completed_while_a_member_is_away",
                        "test_failed_work_reports_its_error", "test_isend_irecv_ring")},
            "torch hands a Python Backend's Works to Python in a PyWorkHolder that forwards wait() and get_future() "
            "only (torch 2.14.1 py/PyProcessGroup.hpp), so its is_completed() stays False: 'is_completed() is False "
            "after wait()', 'is_completed() is False after the Work failed', and result() raises 'RuntimeError: "
            "result() not implemented.'", torch=">=2.14"),
        Gap({"work": "duration"},
            "torch's PyWorkHolder does not forward _get_duration() to a Python Backend's Work: 'RuntimeError: This "
            "Backend doesn't support getDuration.' (torch 2.14.1)", torch=">=2.14"),
        Gap({"feature": "recv_any_source"},
            "torch's PyWorkHolder does not forward source_rank() to a Python Backend's Work, so recv without src "
            "fails after the message arrived: 'RuntimeError: sourceRank() may only be called on work objects that "
            "correspond to a recv or recv-from-any call.' (torch 2.14.1)", torch=">=2.14"),
        Gap({"flight_recorder": "pg_config", "recorder": "backend"},
            "a Python Backend is never told its group's description (c10d's Backend::setGroupDesc is not virtual and "
            "torch 2.14.1 binds no getter for it), so the reference's recorder describes the group 'undefined' where "
            "its entries say 'default_pg'", torch=">=2.14"),
    ),
    description="pure-Python reference process group over its own TCP mesh (the oracle)",
    # per live group and rank: its listening socket and one connection per peer; an accept/dial thread,
    # a worker and one reader per peer (suites/soak/test_resources.py)
    resource_budget=ResourceBudget(fds_fixed=1, fds_per_peer=1, threads_fixed=2, threads_per_peer=1),
    # a timed-out collective closes the group's connections (process_group.py, _close_after_timeout): the ranks
    # that timed out fail their next collective at once with 'the group is unusable after all_reduce
    # (collective #1) timed out', the rank that had stayed away with 'rank N closed the connection'
    # torch 2.14's get_error() (backends/reference/fault_tolerance.py): COMM_ERROR after abort(), as NCCL2 reports
    # it (torch's test_c10d_fault_tolerance.py); TIMEOUT after a timed-out collective; REMOTE_ERROR once a peer's
    # connection broke (a reset: 'rank N connection failed: [Errno 104] Connection reset by peer')
    errors_after_faults=ErrorsAfterFaults(after_abort="COMM_ERROR", after_timeout="TIMEOUT", after_reset="REMOTE_ERROR"),
    after_timeout=AfterTimeout(usable=False, error=r"^RuntimeError: reference: .*(the group is unusable after .* "
                                                   r"timed out|rank \d+ closed the connection)"),
    # its own lazy connection switch (process_group.py): each pair connects when an operation first needs it
    lazy_connect_env={LAZY_INIT_ENV: "1"},
)
