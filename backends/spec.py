"""What a backend is, as data: name, availability, devices, init options, capabilities.

Capabilities are a list of known gaps. A test states what it exercises
(``collective="all_reduce", op="avg", dtype="int32"``); the first gap whose
pattern matches decides the outcome in one place:

* ``xfail`` (default): the case still runs; the backend's actual error (or the
  wrong value it produced) becomes the finding in the report. The xfail is
  strict, so a backend that gains the feature turns the case red until its
  spec is updated: capability data cannot silently rot.
* ``skip``: the case is not run because running it would wedge or kill the
  world (e.g. a hang with no timeout). Use sparingly and say so.

A backend without a spec (a plugin) has no gaps: it is held to the full
contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping


@dataclass(frozen=True)
class Gap:
    """One thing a backend does not do, and why."""

    match: Mapping[str, object]  # requirement key -> value, or a set/tuple of values
    reason: str
    outcome: str = "xfail"  # "xfail" or "skip"

    def matches(self, need: Mapping[str, object]) -> bool:
        for key, want in self.match.items():
            if key not in need:
                return False
            have = need[key]
            if isinstance(want, (set, frozenset, tuple, list)):
                if have not in want:
                    return False
            elif have != want:
                return False
        return True


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""


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

    def availability(self) -> Availability:
        try:
            return self.check_available()
        except Exception as exc:  # an availability probe must never crash collection
            return Availability(False, f"availability check failed: {exc!r}")

    def gap_for(self, **need: object) -> Gap | None:
        """The first known gap covering this requirement, or None if it is part of the contract."""
        need = {k: _normalise(v) for k, v in need.items() if v is not None}
        for gap in self.gaps:
            if gap.matches(need):
                return gap
        return None


def _normalise(value: object) -> object:
    """Let tests pass torch dtypes / ReduceOps directly; specs are written with short strings."""
    text = str(value)
    if text.startswith("torch."):
        return text[len("torch."):]
    for prefix in ("ReduceOp.", "RedOpType."):  # str(dist.ReduceOp.SUM) is "RedOpType.SUM" on torch 2.x
        if text.startswith(prefix):
            return text[len(prefix):].lower()
    return value
