"""What a backend is, as data: name, availability, devices, init options, capabilities.

Capabilities are a list of known gaps, one model for every owner of gaps (a
c10d backend here, an RPC agent in backends/rpc_agents.py; what a backend
lacks under one DDP implementation is its gap with ``impl=``). A test states
what it exercises (``collective="all_reduce", op="avg", dtype="int32"``) in
the one vocabulary of ``REQUIREMENT_KEYS`` below (keys, and the values of the
closed ones); ``gap_for`` returns the first gap that matches and
holds here, and fixtures/pytest_plugin.py:mark_gap turns it into the case's
outcome, in one place:

* ``xfail`` (default): the case still runs; the backend's actual error (or the
  wrong value it produced) becomes the finding in the report. The xfail is
  strict, so a backend that gains the feature turns the case red until its
  spec is updated: capability data cannot silently rot.
* ``skip``: the case is not run because running it would wedge or kill the
  world (e.g. a hang with no timeout). Use sparingly and say so.
* ``intermittent``: the deviation shows in some runs only (timing, not the
  code under test): a non-strict xfail that excuses an assertion failure
  only, never an error. Say what was measured.

A gap may hold only in some environments (``env`` / ``unless_env``: values of
environment variables, seen as the ranks see them: the process environment
with the spec's ``rank_env`` on top) and only on some torch releases
(``torch``: a PEP 440 specifier such as ``">=2.12,<2.14"``).

A backend without a spec (a plugin) has no gaps: it is held to the full
contract. A spec may declare ``inherits="gloo"``: the registry then appends
that backend's gaps (and its ancestors') after its own, so a wrapper of gloo
starts from gloo's known gaps and only its own bugs show.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

# ----------------------------------------------------------- requirement keys
# The one vocabulary of requirements: every key a gap may match on and a test may state, what
# it means, and (for a closed key) every value it may take. A gap, a needs() marker or a
# gap_for() call naming any other key, or a closed key's other value, is an error when it is
# read (UnknownRequirementKey / UnknownRequirementValue): a typo would otherwise be a gap that
# never matches, or a case that escapes its gap.
# Where PyTorch describes the same capability on a backend, the meaning names it (c10d
# ``Backend`` properties of torch 2.13, ``supports_complex`` in distributed_c10d, and the
# BackendConfig flags of test/distributed/c10d_backend_common.py that issue 15 names).


@dataclass(frozen=True)
class Requirement:
    """One requirement key: what it means, its values if the set is closed, and whether a test
    parameter of the same name states it."""

    meaning: str
    values: tuple[str, ...] | None = None  # None: open (values named by the case, the backend or a plugin)
    parameter: bool = False  # ``@pytest.mark.parametrize("<key>", ...)`` states the requirement per case


# Values of ``feature=``, and the PyTorch flag each corresponds to where one exists.
FEATURES: dict[str, str | None] = {
    "subgroups": None,  # new_group of a subset of ranks
    "group_timeout": None,  # new_group(timeout=...) honoured by collectives
    "barrier_timeout": None,
    "monitored_barrier": None,
    "recv_any_source": None,
    "send_to_self": None,
    "object_collectives": None,
    "ddp": None,
    "lifecycle": None,  # destroy_process_group / init again in the same processes
    "abort": None,  # ProcessGroup abort/shutdown
    "sparse": None,  # sparse COO all_reduce
    "premul_sum": None,  # ReduceOp.PREMUL_SUM
    "work_api": None,  # Work.is_completed / is_success / exception / get_future / result
    "work_wait_timeout": None,  # Work.wait(timeout) raising on expiry
    "async_work": None,  # several collectives in flight before waiting (functional collectives)
    "autograd": None,  # collectives differentiated through (functional collectives' backward)
    "bitwise_determinism": None,  # the same inputs reduce to the same bits run after run
    "debug_wrapper": None,  # torch's collective-checking wrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL)
    "coalescing": "supports_coalescing",  # c10d Backend.supports_coalescing
    "work_sequence_number": "supports_work_sequence_number",  # BackendConfig (c10d_backend_common)
    "splitting": "supports_splitting",  # c10d Backend.supports_splitting (split_group)
    "shrinking": "supports_shrinking",  # c10d Backend.supports_shrinking
    "time_estimate": "supports_time_estimate",  # c10d Backend.supports_time_estimate
    "tensor_alloc": "supports_tensor_alloc",  # c10d Backend.supports_tensor_alloc(device)
    "concurrent_groups": None,  # operations on separate groups from separate threads at once (suites/soak)
    "big_count": None,  # a collective over more than 2**31 elements (suites/soak)
    "concurrent_group_creation": None,  # groups created from several threads at once over one store client
    # what a group's backend reports and offers beyond collectives (suites/c10d/test_capabilities.py)
    "backend_options": None,  # group._get_backend(device).options._timeout: the timeout it was created with
    "pg_options": None,  # every field of the pg_options a group was made with is what its backend's options report
    "merge_remote_group": None,  # ProcessGroup.merge_remote_group joins groups over a store into one
    "completion_hook": None,  # ProcessGroup._register_on_completion_hook: once per Work, seq and duration
    "pending_works": None,  # ProcessGroup._wait_for_pending_works
    "suspend_resume": None,  # Backend.suspend() / resume()
    "memory_stats": None,  # Backend.memory_stats()
    # torch 2.14's fault-tolerance API (suites/c10d/test_reconfigure.py, test_fault_signals.py, test_op_hooks.py)
    "reconfigure": "supports_reconfigure",  # init_process_group(enable_reconfigure=True), reconfigure(uuid, handles)
    # torch's own reconfigure helpers (dist._supports_reconfigure, ...), which refuse a group of several backends
    # before asking any: the torch release's, whatever the backend supports
    "reconfigure_helpers": None,
    "get_error": None,  # Backend.get_error() -> ErrorType, as the spec's ErrorsAfterFaults declares
    "abort_hooks": None,  # Backend.register_abort_hook / unregister_abort_hook: called when a fault revokes the group
    "op_hooks": None,  # ProcessGroup.register_pre_hook / register_post_hook (PreHookArgs, PostHookArgs, HookOpName)
    "mixed_string": None,  # init_process_group("cpu:<backend>,cuda:gloo") serves each device by its backend
}

# Element types by the name torch gives them (str(torch.float32) without "torch."), torch 2.13's
# dtypes that tensors of a collective can have (tests/test_specs.py checks each is a torch dtype).
DTYPES = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
          "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")

# What the flight-recorder clauses (suites/c10d/test_flight_recorder.py) read, as ``flight_recorder=`` values:
# the entries of collectives and of p2p calls, their state once completed, pg_status, pg_config, and torch's
# analyser fr_trace on the dumps. A backend that records nothing names them all.
FLIGHT_RECORDER_PARTS = ("collectives", "p2p", "completion", "pg_status", "pg_config", "analyser")
# Which recorder a flight-recorder clause reads, as ``recorder=`` values: torch's own (what torch's tooling and users'
# tools read), or the backend's own, registered through backends/flight_recorders.py.
RECORDERS = ("torch", "backend")

REQUIREMENT_KEYS: dict[str, Requirement] = {
    # c10d: what a case calls
    "collective": Requirement(
        "c10d operation family: torch's, and any family suites/collectives.py's table adds (add_value_source)",
        ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all",
         "barrier", "send_recv", "batch_isend_irecv"), parameter=True),
    "form": Requirement(
        "how the operation is called: list (one tensor per rank) or single (one flat tensor; gather+single = "
        "supports_gather_single); device: inside _coalescing_manager(device=...) (start/end coalescing); "
        "functional, dtensor, fsdp: through that layer of torch.distributed (suites/parallel); and any form "
        "suites/collectives.py's table adds (add_value_source)",
        ("list", "single", "device", "functional", "dtensor", "fsdp"), parameter=True),
    "split": Requirement("all_to_all split sizes", ("even", "uneven"), parameter=True),
    "op": Requirement(
        "reduce op, lower case (complex: torch's supports_complex(op))",
        ("sum", "product", "min", "max", "avg", "band", "bor", "bxor", "premul_sum"), parameter=True),
    "dtype": Requirement("element type as torch names it: BackendConfig dtype sets", DTYPES, parameter=True),
    "layout": Requirement("contiguous, or non_contiguous (a strided view)", ("contiguous", "non_contiguous"),
                          parameter=True),
    "shape": Requirement("shape class of the tensors (suites/c10d/differential.py:shape_class)",
                         ("scalar", "1d", "2d", "empty"), parameter=True),
    "feature": Requirement("a named capability, see FEATURES", tuple(FEATURES), parameter=True),
    "bad_input": Requirement("a named bad-input case of suites/c10d/test_bad_input.py"),
    "bad_peer": Requirement("a named bad-peer case of suites/p2p/test_p2p_errors.py"),
    "work": Requirement(
        "how a Work is used: held_by_cpp (torch's reducer keeps it after Python drops it), member_away (issued "
        "while a member is away), duration (timed), pending_on_abort (waited on after an abort)",
        ("held_by_cpp", "member_away", "duration", "pending_on_abort")),
    "entry_point": Requirement("a torch.distributed entry point by its name (suites/c10d/test_entry_points.py)"),
    "flight_recorder": Requirement("what a clause reads of a flight recorder (which recorder: recorder=)",
                                   FLIGHT_RECORDER_PARTS),
    "recorder": Requirement(
        "which flight recorder a clause reads: torch (c10d's C++ FlightRecorder, what torch's fr_trace and users' "
        "tools read) or backend (the backend's own, registered through backends/flight_recorders.py by a backend "
        "that cannot record into torch's)", RECORDERS, parameter=True),
    "clause": Requirement("one clause by its test function name, stated by that clause's needs(), for a gap that "
                          "holds for it alone (e.g. a torch release breaking one call)"),
    # RPC agents (backends/rpc_agents.py)
    "backend": Requirement("the c10d backend under test, for gaps of an agent that runs over it (reference-pg)"),
    "device_type": Requirement("the device type of the ranks' tensors (the backend spec's device_type), for gaps "
                               "of an agent that holds on some devices only (TensorPipe's device maps)"),
    "rpc_feature": Requirement(
        "a named RPC capability",
        ("async_execution", "async_future_exception", "custom_exception_type", "device_maps", "fault_injection",
         "profiled_callee_events", "rref_to_owner_before_created", "torchscript", "unused_send_function",
         "wait_all_early_error")),
    "rpc_call": Requirement(
        "how an RPC is made: rpc_sync, rpc_async, remote, or rref_method (a method of an RRef's value through "
        "rref.rpc_sync()); the modes of suites/rpc/call_modes.py's table, which the rpc, profiling and stress "
        "code sweep (add_value_source)", ("rpc_sync", "rpc_async", "remote", "rref_method"), parameter=True),
    "workload": Requirement("a profiling workload of suites/profiling/workloads.py (or concurrent_calls)",
                            parameter=True),
    # network faults on simulated hosts (suites/faults)
    "fault": Requirement("a network fault of suites/faults/table.py's table (tests/test_fault_table.py keeps the "
                         "two the same)", ("partition", "refused", "one_way", "flap", "slow", "lossy",
                                           "cut_after_bytes", "frozen", "control_plane", "data_plane"),
                         parameter=True),
    "operation": Requirement("an operation under a network fault, of suites/faults/operations.py's table "
                             "(tests/test_fault_table.py keeps the two the same)",
                             ("all_reduce", "barrier", "p2p", "store_get"), parameter=True),
    # DDP implementations (suites/ddp/impls.py)
    "impl": Requirement("DDP implementation", ("torch", "reference"), parameter=True),
}

# Closed keys whose further values another module defines, one that imports this one (so this one
# cannot import it): suites/collectives.py's table supplies its families and forms, entries a
# plugin adds at run time included; suites/rpc/call_modes.py its RPC call modes. key -> functions returning values, read at every check.
_VALUE_SOURCES: dict[str, list[Callable[[], Iterable[str]]]] = {}


def add_value_source(key: str, source: Callable[[], Iterable[str]]) -> None:
    """Let the module that defines values of closed key ``key`` supply them (``source()`` is read at
    every check, so values added later count too)."""
    if REQUIREMENT_KEYS[key].values is None:
        raise ValueError(f"requirement key {key!r} is open: any value is known (backends/spec.py REQUIREMENT_KEYS)")
    _VALUE_SOURCES.setdefault(key, []).append(source)


def known_values(key: str) -> tuple[str, ...] | None:
    """The values closed key ``key`` may take (its own and its sources'), or None for an open key."""
    own = REQUIREMENT_KEYS[key].values
    if own is None:
        return None
    supplied = (value for source in _VALUE_SOURCES.get(key, ()) for value in source())
    return tuple(dict.fromkeys((*own, *supplied)))


# Test parameters that state a requirement (fixtures/pytest_plugin.py, reports/contracts.py).
PARAMETER_KEYS: tuple[str, ...] = tuple(key for key, requirement in REQUIREMENT_KEYS.items() if requirement.parameter)

# PyTorch's capability flags (c10d Backend properties, BackendConfig flags of
# c10d_backend_common) -> the requirement a case states when it needs that capability.
TORCH_FLAGS: dict[str, dict[str, object]] = {
    **{flag: {"feature": feature} for feature, flag in FEATURES.items() if flag},
    "supports_gather_single": {"collective": "gather", "form": "single"},
    # distributed_c10d.supports_complex(op) is per op; a backend without complex at all lacks these dtypes
    "supports_complex": {"dtype": ("complex32", "complex64", "complex128")},
}

OUTCOMES = ("xfail", "skip", "intermittent")

# What running a case that hits the gap does to the world it runs in. On one
# host the pool forks a new world after a lost one; a world started by a
# launcher (fixtures/launch/) cannot be replaced, so it runs such cases last.
CONSEQUENCES: dict[str, str] = {
    "fails": "the case fails (an error or a wrong value) and the world stays usable",
    "kills_rank": "a rank process aborts or crashes, at once or later (a corrupted heap): the world is lost",
    "hangs": "a rank blocks until a timeout the harness cannot shorten: the world is lost",
    "breaks_backend": "the ranks live but their backend stays broken (a communicator in an error state that fresh "
                      "process groups in the same processes inherit): the world is replaced after the case",
}


def _normalise(value: object) -> object:
    """Let tests pass torch dtypes / ReduceOps directly; specs are written with short strings."""
    text = str(value)
    if text.startswith("torch."):
        return text[len("torch."):]
    for prefix in ("ReduceOp.", "RedOpType."):  # str(dist.ReduceOp.SUM) is "RedOpType.SUM" on torch 2.x
        if text.startswith(prefix):
            return text[len(prefix):].lower()
    return value


class UnknownRequirementKey(ValueError):
    """A gap, a needs() marker or a gap_for() call names a key that is not in REQUIREMENT_KEYS."""


class UnknownRequirementValue(UnknownRequirementKey):
    """A gap, a needs() marker or a gap_for() call gives a closed key a value it does not have."""


def check_requirement_keys(need: Mapping[str, object], where: str) -> None:
    """Every key of ``need`` (a gap's match, a case's requirements) is in REQUIREMENT_KEYS, and every
    value of a closed key (a value or a collection of values; torch dtypes and ReduceOps as tests
    pass them) is one of that key's values. None (a key a test does not exercise) is no value."""
    unknown = sorted(k for k in need if k not in REQUIREMENT_KEYS)
    if unknown:
        raise UnknownRequirementKey(
            f"{where}: unknown requirement key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(REQUIREMENT_KEYS)} (backends/spec.py REQUIREMENT_KEYS)")
    for key, wanted in need.items():
        allowed = known_values(key)
        if allowed is None or wanted is None:
            continue
        values = wanted if isinstance(wanted, (set, frozenset, tuple, list)) else (wanted,)
        bad = [repr(v) for v in values if _normalise(v) not in allowed]
        if bad:
            raise UnknownRequirementValue(
                f"{where}: unknown {key} {', '.join(bad)}; known: {', '.join(allowed)} "
                f"(backends/spec.py REQUIREMENT_KEYS[{key!r}])")


def parameter_requirements(params: Mapping[str, object]) -> dict[str, object]:
    """The requirements a case's parameters state: those named like a PARAMETER_KEYS key, with a
    value of that key (normalised). A closed key's parameter with another value means something
    else in that test (a torch function name as ``collective``) and states nothing; the case's
    needs() markers say what it needs."""
    need: dict[str, object] = {}
    for key in PARAMETER_KEYS:
        if key not in params:
            continue
        value = _normalise(params[key])
        allowed = known_values(key)
        if allowed is None or value in allowed:
            need[key] = value
    return need


def gaps_from_flags(flags: Mapping[str, bool], reason: str) -> tuple["Gap", ...]:
    """Gaps for every PyTorch capability flag set to False (e.g. a backend's BackendConfig).

    ``gaps_from_flags({"supports_coalescing": False}, "my_backend declares it")``
    -> ``(Gap({"feature": "coalescing"}, "supports_coalescing=False: my_backend declares it"),)``.
    An unknown flag is an error naming it.
    """
    unknown = sorted(f for f in flags if f not in TORCH_FLAGS)
    if unknown:
        raise UnknownRequirementKey(f"unknown capability flag(s) {', '.join(map(repr, unknown))}; "
                                    f"known: {', '.join(TORCH_FLAGS)} (backends/spec.py TORCH_FLAGS)")
    return tuple(Gap(dict(TORCH_FLAGS[flag]), f"{flag}=False: {reason}") for flag, on in flags.items() if not on)


# ------------------------------------------------------------------- Gap
@dataclass(frozen=True)
class Gap:
    """One thing a backend (agent, implementation) does not do, and why.

    ``Gap({key: value or collection of values}, "reason", outcome=...)``;
    the keywords after ``outcome`` narrow where it holds.
    """

    match: Mapping[str, object]  # requirement key -> value, or a set/tuple of values
    reason: str
    outcome: str = "xfail"  # see OUTCOMES and the module docstring
    env: Mapping[str, object] = field(default_factory=dict)  # holds only if every variable matches
    unless_env: Mapping[str, object] = field(default_factory=dict)  # holds only if no variable matches
    torch: str = ""  # PEP 440 specifier of the torch releases it holds on ("" = every release)
    source: str = ""  # the backend it was inherited from (set by the registry)
    consequence: str = "fails"  # what running the case does to its world, see CONSEQUENCES
    # holds only in worlds of at least this many ranks: a deviation between ranks (or in how a backend splits
    # work among them) is absent from a world of one, where the strict xfail would otherwise XPASS
    min_world_size: int = 1

    def __post_init__(self):
        check_requirement_keys(self.match, f"Gap({dict(self.match)!r}, {self.reason[:60]!r}...)")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Gap({dict(self.match)!r}): outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        if self.consequence not in CONSEQUENCES:
            raise ValueError(f"Gap({dict(self.match)!r}): consequence {self.consequence!r} is not one of "
                             f"{', '.join(CONSEQUENCES)}")
        if self.torch:
            _specifier(self.torch)  # a malformed specifier fails when the spec loads, not when matched

    @property
    def loses_world(self) -> bool:
        """Running a case that hits this gap leaves its world unusable (a rank dies or hangs)."""
        return self.consequence != "fails"

    def matches(self, need: Mapping[str, object]) -> bool:
        return all(key in need and _value_matches(need[key], want) for key, want in self.match.items())

    def holds(self, env: Mapping[str, str] | None = None, torch_version: str | None = None,
              world_size: int | None = None) -> bool:
        """Whether the gap applies in this environment, torch release (default: this process's) and world size
        (None: any)."""
        if world_size is not None and world_size < self.min_world_size:
            return False
        env = os.environ if env is None else env
        if any(not _value_matches(env.get(name), want) for name, want in self.env.items()):
            return False
        if any(_value_matches(env.get(name), want) for name, want in self.unless_env.items()):
            return False
        if self.torch:
            version = _torch_version() if torch_version is None else torch_version
            if not _specifier(self.torch).contains(_public(version), prereleases=True):
                return False
        return True

    def conditions(self) -> str:
        """Where it holds, for the report ("" when everywhere)."""
        parts = [f"{k}={_show(v)}" for k, v in self.env.items()]
        parts += [f"{k} not {_show(v)}" for k, v in self.unless_env.items()]
        if self.torch:
            parts.append(f"torch {self.torch}")
        if self.min_world_size > 1:
            parts.append(f"world size >= {self.min_world_size}")
        return f"holds with {', '.join(parts)}" if parts else ""


def _value_matches(have: object, want: object) -> bool:
    if isinstance(want, (set, frozenset, tuple, list)):
        return have in want
    return have == want


def _show(value: object) -> str:
    if isinstance(value, (set, frozenset, tuple, list)):
        return "|".join("(unset)" if v is None else str(v) for v in value)
    return "(unset)" if value is None else str(value)


def _specifier(text: str):
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(f"Gap torch={text!r} is not a version specifier (expected e.g. '>=2.12,<2.14')") from None


def _public(version: str) -> str:
    from packaging.version import Version

    return Version(str(version)).public  # 2.13.0+cpu -> 2.13.0


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def gap_for(gaps: Iterable[Gap], env: Mapping[str, str] | None = None, world_size: int | None = None,
            **need: object) -> Gap | None:
    """The first gap covering this requirement that holds here, or None if it is part of the contract.

    The single lookup for backend, agent and implementation gaps. ``need``
    values may be torch dtypes or ReduceOps; None values are dropped (a test
    that does not exercise a key).
    """
    check_requirement_keys(need, "gap_for")
    need = {k: _normalise(v) for k, v in need.items() if v is not None}
    for gap in gaps:
        if gap.matches(need) and gap.holds(env, world_size=world_size):
            return gap
    return None


# Gaps torch itself imposes on backends (its Python layer refuses before the backend is asked): one
# declaration each, listed by every spec they hold for.
MONITORED_BARRIER_GLOO_ONLY = Gap(
    {"feature": "monitored_barrier"},
    "dist.monitored_barrier refuses every backend not named 'gloo' ('monitored_barrier is only implemented for "
    "GLOO backend')")
SPLIT_NEEDS_ACCELERATOR = Gap(
    {"feature": "splitting"},
    "split_group needs a default group bound to an accelerator device: on CPU torch 2.13 refuses before asking "
    "the backend ('RuntimeError: No device associated with the default pg, not safe to split any process "
    "groups'; it splits NCCL/XCCL groups only, or gloo under torchcomms)")
# The ranks' --init mode as gaps see it (env=): set by the harness in every rank (fixtures/pytest_plugin.py
# Target.rank_env, fixtures/world.py), "lazy" or "eager" (fixtures/devices.py INIT_MODES).
INIT_ENV = "DISTCONFORM_INIT"
SPLIT_NEEDS_EAGER_INIT = Gap(
    {"feature": "splitting"},
    "split_group needs the default group bound to a device, which only an eager init gives (init_process_group("
    "device_id=...), --init eager): under lazy init torch 2.13 refuses before asking the backend ('RuntimeError: No "
    "device associated with the default pg, not safe to split any process groups')",
    env={INIT_ENV: "lazy"})

LOCAL_SYNC_DESYNCS_GROUP_NAMES = Gap(
    {"clause": "test_new_group_local_synchronization"},
    "torch 2.14's _process_group_name counts every group creation (2.13: unhashed names only), but "
    "new_group(use_local_synchronization=True) reaches it on the members only: the ranks' group counters "
    "diverge, the next new_group of every rank gets a different name (store prefix) per rank and its "
    "rendezvous blocks (new_subgroups then misses its deadline on every backend)",
    outcome="skip", consequence="hangs", torch=">=2.14")

# What torch releases before 2.14 lack, for every backend (a plugin without a spec included): gaps of the torch
# release, not of a backend, so BackendSpec.gap_for reads them before the spec's own (on torch 2.13 a backend's
# strict xfail of the same feature would otherwise run a case that can only raise AttributeError).
FAULT_TOLERANCE_API = {
    "reconfigure": "init_process_group(enable_reconfigure=True), Backend.reconfigure(ReconfigureOptions), "
                   "get_reconfigure_handle() and dist._reconfigure",
    "reconfigure_helpers": "dist._supports_reconfigure, dist._get_reconfigure_handle and dist._reconfigure",
    "get_error": "Backend.get_error() (ErrorType exists in 2.13, nothing returns it)",
    "abort_hooks": "Backend.register_abort_hook / unregister_abort_hook",
    "op_hooks": "ProcessGroup.register_pre_hook / register_post_hook (PreHookArgs, PostHookArgs, HookOpName)",
}
TORCH_RELEASE_GAPS: tuple["Gap", ...] = tuple(
    Gap({"feature": feature}, f"torch 2.14 adds {api}; this torch has none of it", outcome="skip", torch="<2.14")
    for feature, api in FAULT_TOLERANCE_API.items())

# A backend written as a Python ProcessGroup (torch's only way before 2.14) in a mixed string: torch uses the object
# itself as the group (distributed_c10d._new_process_group_helper: "This defaults to the old behavior for
# PythonProcessGroups which overwrites the ProcessGroup instance"), so the string's other devices are dropped.
# torch's TCPStore under a network fault (suites/faults/test_network_faults.py, store_get): the store is torch's,
# whatever the backend, so every backend that opens a TCPStore shares it
TCPSTORE_GET_UNBOUNDED = Gap(
    {"clause": ("test_the_operation_ends_within_its_timeout", "test_every_rank_gets_a_runtime_error",
                "test_the_error_names_the_operation_or_the_peer"),
     "operation": "store_get", "fault": ("partition", "one_way", "flap", "control_plane")},
    "torch's TCPStore client does not bound a get whose request or reply is dropped silently: on a client made "
    "with timeout=2 s, get() of a key that exists was still running after 7 s while the host's store traffic was "
    "dropped (partition, one_way, flap, control_plane; torch 2.13, with gloo and the reference alike). Healed after "
    "10 s, it ended at 13.69 s with 'DistStoreError: wait timeout after 2000ms, keys: /distconform-fault/1'")

PYTHON_PROCESS_GROUP_TAKES_EVERY_DEVICE = Gap(
    {"feature": "mixed_string"},
    "a Python ProcessGroup becomes the whole group of a mixed string: 'cpu:<it>,cuda:gloo' gives the group itself "
    "(get_backend() still names the string) and cuda has no backend ('RuntimeError: No backend type associated "
    "with device type cuda'; torch 2.13 and 2.14.1). torch 2.14 constructs Python Backend subclasses, which are "
    "routed per device (measured: 'cpu:mine,cuda:gloo' serves cpu by Mine, cuda by ProcessGroupGloo)")

# ------------------------------------------------------------- backends
@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""


@dataclass(frozen=True)
class ResourceBudget:
    """What one live process group over the whole world may hold on each rank, at world size n.

    Each count is ``fixed + per_peer * (n - 1)``; suites/soak/test_resources.py measures the cost of a
    group (descriptors from /proc/self/fd, OS threads from /proc/self/task) and fails where it exceeds
    the budget. A process limited to 1024 descriptors fits about 1024 / fds(n) groups."""

    fds_fixed: int = 0
    fds_per_peer: int = 0
    threads_fixed: int = 0
    threads_per_peer: int = 0

    def fds(self, world_size: int) -> int:
        return self.fds_fixed + self.fds_per_peer * (world_size - 1)

    def threads(self, world_size: int) -> int:
        return self.threads_fixed + self.threads_per_peer * (world_size - 1)


@dataclass(frozen=True)
class AfterTimeout:
    """What a group does once one of its collectives timed out (suites/c10d/test_timeouts.py).

    ``usable``: the next collective every member joins succeeds. Otherwise every member's next collective
    on the group raises at once (within half the group's timeout), with an error matching ``error`` (a regular
    expression, re.search). Never a hang either way."""

    usable: bool
    error: str = ""


ERROR_TYPES = ("SUCCESS", "TIMEOUT", "COMM_ERROR", "REMOTE_ERROR")  # torch 2.14's c10d ErrorType, by name


@dataclass(frozen=True)
class ErrorsAfterFaults:
    """What ``Backend.get_error()`` (torch 2.14) returns after ``abort()``, after one of the group's collectives
    timed out, and after one failed because a peer's host reset its connections (suites/c10d/test_fault_signals.py,
    suites/faults/test_partition_recovery.py under the table's ``refused``), as ErrorType names. "" for after_abort:
    not declared (any ErrorType). The defaults are what the names mean: a timed-out group reports TIMEOUT, one whose
    peer reset its connections REMOTE_ERROR."""

    after_abort: str = ""
    after_timeout: str = "TIMEOUT"
    after_reset: str = "REMOTE_ERROR"

    def __post_init__(self):
        for name in (self.after_abort, self.after_timeout, self.after_reset):
            if name and name not in ERROR_TYPES:
                raise ValueError(f"ErrorsAfterFaults: {name!r} is not an ErrorType ({', '.join(ERROR_TYPES)})")


@dataclass
class BackendSpec:
    """Everything the harness and the suites need to know about one backend."""

    name: str
    device_type: str = "cpu"
    check_available: Callable[[], Availability] = lambda: Availability(True)
    # keyword arguments for init_process_group besides backend/store/rank/world_size
    init_options: Mapping[str, object] = field(default_factory=dict)
    # environment variables every rank process gets (e.g. NCCL's blocking wait)
    rank_env: Mapping[str, str] = field(default_factory=dict)
    # command prefix that starts all ranks at once (mpirun); empty: the harness spawns each rank
    launcher: tuple[str, ...] = ()
    gaps: tuple[Gap, ...] = ()
    # what it does differently where it serves one device of a string that names other backends too
    # (``cpu:<it>,cuda:gloo``, backends/mixed.py): added to that world's gaps
    gaps_beside_other_backends: tuple[Gap, ...] = ()
    description: str = ""
    has_spec: bool = True  # False for a plugin backend we know nothing about
    # another backend whose gaps also apply (a wrapper of gloo: "gloo"); resolved by the registry
    inherits: str = ""
    inherited_gaps: tuple[Gap, ...] = ()  # filled by BackendRegistry from ``inherits``
    # per-group descriptors and threads a rank may hold (suites/soak); None: no budget declared, only measured
    resource_budget: ResourceBudget | None = None
    # the name init_process_group gets ('' = ``name``): lets one torch backend appear as several targets,
    # e.g. "gloo-cuda" is torch's gloo with CUDA tensors
    torch_backend: str = ""
    # the flight recorder its groups record into besides torch's, by the name it registers under
    # (backends/flight_recorders.py; '' : none): the recorder=backend cases of suites/c10d/test_flight_recorder.py
    # read it (a recorder never registered holds nothing they can read: they fail). Said by the spec, not found in
    # the rank: a rank process serving one device of a mixed string also holds the other backend's recorder
    # (cpu:gloo,dcdev:native-dcdev: native's, which the gloo-served cpu world never writes to)
    own_flight_recorder: str = ""
    # ranks may share a device (rank r on <type>:r mod count): only for backends that cannot deadlock
    # on a shared device (gloo stages CUDA tensors through host memory; NCCL must never share, see devices.py)
    shares_devices: bool = False

    # the group after one of its collectives timed out; None: not declared (the clause then checks only that
    # nothing hangs and that every member gets the same outcome)
    after_timeout: AfterTimeout | None = None
    # what get_error() returns after an abort and after a timeout (torch 2.14's fault-tolerance API)
    errors_after_faults: ErrorsAfterFaults = ErrorsAfterFaults()
    # the backend's lazy connection switch: the environment under which a group, made while it is set, connects at
    # its first operation instead of when it is made (gloo: TORCH_GLOO_LAZY_INIT=1; empty: lazy without a switch,
    # as NCCL without device_id). None: every group connects when it is made, so no fault can come before its first
    # connection (suites/faults' first-collective clause skips, saying so)
    lazy_connect_env: Mapping[str, str] | None = None

    @property
    def init_backend(self) -> str:
        """What init_process_group is called with."""
        return self.torch_backend or self.name

    @property
    def all_gaps(self) -> tuple[Gap, ...]:
        """Own gaps first (they win), then the inherited ones."""
        return tuple(self.gaps) + tuple(self.inherited_gaps)

    def availability(self) -> Availability:
        try:
            return self.check_available()
        except Exception as exc:  # an availability probe must never crash collection
            return Availability(False, f"availability check failed: {exc!r}")

    def gap_for(self, env: Mapping[str, str] | None = None, world_size: int | None = None,
                **need: object) -> Gap | None:
        """The first known gap covering this requirement that holds here, or None if it is part of the contract.

        Environment conditions are judged on what the ranks see: this process's
        environment, the spec's ``rank_env`` and ``env`` (the harness's own
        variables, e.g. TORCH_DISTRIBUTED_DEBUG of the target) on top.
        """
        return gap_for((*TORCH_RELEASE_GAPS, *self.all_gaps), env={**os.environ, **self.rank_env, **(env or {})}, world_size=world_size, **need)


def inherit(spec: BackendSpec, parent: BackendSpec) -> BackendSpec:
    """``spec`` with ``parent``'s gaps (own and inherited) appended, each naming where it came from, and its lazy
    connection switch where ``spec`` declares none."""
    gaps = tuple(g if g.source else replace(g, source=parent.name) for g in parent.all_gaps)
    # a wrapper connects through its parent, so the parent's lazy switch is its own unless it declares one
    lazy = spec.lazy_connect_env if spec.lazy_connect_env is not None else parent.lazy_connect_env
    return replace(spec, inherited_gaps=gaps, lazy_connect_env=lazy)
