"""What a backend is, as data: name, availability, devices, init options, capabilities.

Capabilities are a list of known gaps, one model for every owner of gaps (a
c10d backend here, an RPC agent in backends/rpc_agents.py, a DDP
implementation in suites/ddp/impls.py). A test states what it exercises
(``collective="all_reduce", op="avg", dtype="int32"``) in the vocabulary of
``REQUIREMENT_KEYS`` below; ``gap_for`` returns the first gap that matches and
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
# Every key a gap may match on and a test may state (needs() markers and the
# need-named parameters). A gap naming any other key is an error when the spec
# loads: a typo would otherwise be a gap that never matches.
# Where PyTorch describes the same capability on a backend, the right column
# names it (c10d ``Backend`` properties of torch 2.13, ``supports_complex`` in
# distributed_c10d, and the BackendConfig flags of test/distributed/
# c10d_backend_common.py that issue 15 names).
REQUIREMENT_KEYS: dict[str, str] = {
    # c10d: what a case calls
    "collective": "c10d operation family: all_reduce, reduce, broadcast, all_gather, gather, scatter, "
                  "reduce_scatter, all_to_all, barrier, send_recv, batch_isend_irecv (suites/collectives.py)",
    "form": "list (one tensor per rank) or single (one flat tensor); gather+single = supports_gather_single",
    "split": "all_to_all split sizes: even or uneven",
    "op": "reduce op: sum product min max avg band bor bxor premul_sum (complex: torch's supports_complex(op))",
    "dtype": "element type name as torch spells it (float32, complex64, float8_e4m3fn, ...): BackendConfig dtype sets",
    "layout": "contiguous or non_contiguous (a strided view)",
    "shape": "scalar, 1d, 2d, empty",
    "feature": "a named capability, see FEATURES",
    "bad_input": "a named bad-input case of suites/c10d/test_bad_input.py",
    "bad_peer": "a named bad-peer case of suites/p2p",
    "work": "how a Work is used: held_by_cpp (torch's reducer keeps it after Python drops it)",
    "entry_point": "a torch.distributed entry point by its name (suites/c10d/test_entry_points.py)",
    # RPC agents (backends/rpc_agents.py)
    "backend": "the c10d backend under test, for gaps of an agent that runs over it (reference-pg)",
    "rpc_feature": "a named RPC capability (async_execution, fault_injection, torchscript, ...)",
    "rpc_call": "how an RPC is made: rpc_sync, rpc_async, remote, rref_method",
    "workload": "a profiling workload of suites/profiling/workloads.py (or concurrent_calls)",
    "mode": "how a profiling workload is called: sync, async, remote",
    # DDP implementations (suites/ddp/impls.py)
    "impl": "DDP implementation: torch or reference",
    "clause": "a clause (test function name) of suites/ddp",
}

# Values of ``feature=``, and the PyTorch flag each corresponds to where one exists. A backend
# spec whose gap names any other feature is an error when the spec loads (so is a test stating one).
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
}

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
# launcher (fixtures/launch.py) cannot be replaced, so it runs such cases last.
CONSEQUENCES: dict[str, str] = {
    "fails": "the case fails (an error or a wrong value) and the world stays usable",
    "kills_rank": "a rank process aborts or crashes, at once or later (a corrupted heap): the world is lost",
    "hangs": "a rank blocks until a timeout the harness cannot shorten: the world is lost",
}


class UnknownRequirementKey(ValueError):
    """A gap (or a test's needs()) names a key that is not in REQUIREMENT_KEYS."""


def check_requirement_keys(keys: Iterable[str], where: str) -> None:
    unknown = sorted(k for k in keys if k not in REQUIREMENT_KEYS)
    if unknown:
        raise UnknownRequirementKey(
            f"{where}: unknown requirement key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(REQUIREMENT_KEYS)} (backends/spec.py REQUIREMENT_KEYS)")


class UnknownFeature(UnknownRequirementKey):
    """A gap (or a test's needs()) names a ``feature=`` value that is not in FEATURES."""


def check_features(match: Mapping[str, object], where: str) -> None:
    """The ``feature=`` value(s) of a gap or a need must be declared in FEATURES (a typo would never match)."""
    if "feature" not in match:
        return
    wanted = match["feature"]
    values = wanted if isinstance(wanted, (set, frozenset, tuple, list)) else (wanted,)
    unknown = sorted(map(repr, (v for v in values if v not in FEATURES)))
    if unknown:
        raise UnknownFeature(
            f"{where}: unknown feature{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"known features: {', '.join(FEATURES)} (backends/spec.py FEATURES)")


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

    def holds(self, env: Mapping[str, str] | None = None, torch_version: str | None = None) -> bool:
        """Whether the gap applies in this environment and torch release (default: this process's)."""
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


def gap_for(gaps: Iterable[Gap], env: Mapping[str, str] | None = None, **need: object) -> Gap | None:
    """The first gap covering this requirement that holds here, or None if it is part of the contract.

    The single lookup for backend, agent and implementation gaps. ``need``
    values may be torch dtypes or ReduceOps; None values are dropped (a test
    that does not exercise a key).
    """
    check_requirement_keys(need, "gap_for")
    check_features(need, "gap_for")
    need = {k: _normalise(v) for k, v in need.items() if v is not None}
    for gap in gaps:
        if gap.matches(need) and gap.holds(env):
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
    description: str = ""
    has_spec: bool = True  # False for a plugin backend we know nothing about
    # another backend whose gaps also apply (a wrapper of gloo: "gloo"); resolved by the registry
    inherits: str = ""
    inherited_gaps: tuple[Gap, ...] = ()  # filled by BackendRegistry from ``inherits``
    # per-group descriptors and threads a rank may hold (suites/soak); None: no budget declared, only measured
    resource_budget: ResourceBudget | None = None

    def __post_init__(self):
        # when the spec loads (a plugin's at import): a feature nobody declared is a typo, never a gap
        for gap in self.gaps:
            check_features(gap.match, f"backend spec {self.name!r}: Gap({dict(gap.match)!r}, {gap.reason[:60]!r}...)")

    @property
    def all_gaps(self) -> tuple[Gap, ...]:
        """Own gaps first (they win), then the inherited ones."""
        return tuple(self.gaps) + tuple(self.inherited_gaps)

    def availability(self) -> Availability:
        try:
            return self.check_available()
        except Exception as exc:  # an availability probe must never crash collection
            return Availability(False, f"availability check failed: {exc!r}")

    def gap_for(self, env: Mapping[str, str] | None = None, **need: object) -> Gap | None:
        """The first known gap covering this requirement that holds here, or None if it is part of the contract.

        Environment conditions are judged on what the ranks see: this process's
        environment, the spec's ``rank_env`` and ``env`` (the harness's own
        variables, e.g. TORCH_DISTRIBUTED_DEBUG of the target) on top.
        """
        return gap_for(self.all_gaps, env={**os.environ, **self.rank_env, **(env or {})}, **need)


def inherit(spec: BackendSpec, parent: BackendSpec) -> BackendSpec:
    """``spec`` with ``parent``'s gaps (own and inherited) appended, each naming where it came from."""
    gaps = tuple(g if g.source else replace(g, source=parent.name) for g in parent.all_gaps)
    return replace(spec, inherited_gaps=gaps)


def _normalise(value: object) -> object:
    """Let tests pass torch dtypes / ReduceOps directly; specs are written with short strings."""
    text = str(value)
    if text.startswith("torch."):
        return text[len("torch."):]
    for prefix in ("ReduceOp.", "RedOpType."):  # str(dist.ReduceOp.SUM) is "RedOpType.SUM" on torch 2.x
        if text.startswith(prefix):
            return text[len(prefix):].lower()
    return value
