"""Device-qualified and mixed backend strings, as ``init_process_group(backend=...)`` takes them.

torch accepts ``"cpu:gloo"`` (gloo serves CPU tensors) and ``"cpu:gloo,cuda:nccl"`` (one backend per
device type; torch's own default for ``backend=None``). Such a string is one target of ``--backend``:

* **Parsing the option.** ``--backend`` is a comma-separated list, and a mixed string contains commas.
  The rule: a plain name (no ``:``) is a target of its own; a device-qualified part (``device:backend``)
  joins the device-qualified string just before it unless that string already names its device, else it
  starts a new one. ``gloo,cpu:gloo,cuda:nccl,cpu:reference`` is three targets: ``gloo``,
  ``cpu:gloo,cuda:nccl`` and ``cpu:reference`` (the second ``cpu`` starts a new string).
* **One world per device.** Every device the string names gets a world of its own, initialised with the
  string; its ranks sit on that device (fixtures/devices.py) and its clauses use tensors there, so each
  device's backend is held to the clauses on its device, with the capabilities (gaps, budgets) of the spec
  of the backend serving it. A string naming one device is its own target name (``cpu:gloo``); one naming
  several gets one name per device, ``<string>@<device>`` (``cpu:gloo,cuda:nccl@cpu``), which is what ids
  and the report show.
* **Unavailable parts.** A world is initialised with the parts that can run here: torch refuses the
  whole string when one part's backend is missing (a CPU-only torch: 'Distributed package doesn't have
  NCCL built in'), so ``cpu:gloo,cuda:nccl`` on a machine without NCCL initialises its CPU world with
  ``cpu:gloo`` and its CUDA world is unavailable, with that part's reason as every CUDA case's skip.
* **What torch does differently for a qualified string** (its Python layer compares the backend's name
  with ``'gloo'``, which ``'cpu:gloo'`` is not) is a gap of every qualified target: ``QUALIFIED_GAPS``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .spec import MONITORED_BARRIER_GLOO_ONLY, Availability, BackendSpec, Gap

DEVICE_MARK = "@"  # <string>@<device>: the world of one device of a string naming several


class BadBackendString(ValueError):
    """A device-qualified backend string torch would not take (the message says which part)."""


@dataclass(frozen=True)
class DevicePart:
    """One ``device:backend`` clause of a qualified string."""

    device: str
    backend: str

    def __str__(self) -> str:
        return f"{self.device}:{self.backend}"


def is_qualified(name: str) -> bool:
    """Whether ``name`` is a device-qualified string (or one device's world of it), not a backend name."""
    return ":" in name


def parse(text: str) -> tuple[DevicePart, ...]:
    """``"cpu:gloo,cuda:nccl"`` -> its parts; BadBackendString when a part has no device or backend, or a
    device appears twice."""
    parts: list[DevicePart] = []
    for raw in text.split(","):
        device, sep, backend = (s.strip() for s in raw.partition(":"))
        if not sep or not device or not backend:
            raise BadBackendString(f"backend string {text!r}: {raw.strip()!r} is not DEVICE:BACKEND "
                                   "(e.g. cpu:gloo,cuda:nccl)")
        if any(p.device == device for p in parts):
            raise BadBackendString(f"backend string {text!r} names device {device!r} twice")
        parts.append(DevicePart(device, backend))
    return tuple(parts)


def split_backend_option(text: str) -> list[str]:
    """The targets of ``--backend TEXT`` (the module docstring's rule), each as the user wrote it."""
    targets: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        previous = targets[-1] if targets else ""
        device = item.partition(":")[0].strip()
        if is_qualified(item) and is_qualified(previous) and device not in {p.device for p in _loose(previous)}:
            targets[-1] = f"{previous},{item}"
        else:
            targets.append(item)
    return targets


def _loose(text: str) -> list[DevicePart]:
    """The parts of a string being assembled (malformed ones are reported later, by parse)."""
    return [DevicePart(d.strip(), b.strip()) for d, _, b in (raw.partition(":") for raw in text.split(","))]


def target_names(given: str) -> list[str]:
    """The target names of one ``--backend`` target: itself, or one per device of a qualified string."""
    if not is_qualified(given):
        return [given]
    parts = parse(given)
    return [given] if len(parts) == 1 else [f"{given}{DEVICE_MARK}{p.device}" for p in parts]


def given_string(name: str) -> str:
    """The ``--backend`` target a target name came from (``cpu:gloo,cuda:nccl@cpu`` -> ``cpu:gloo,cuda:nccl``)."""
    return name.rpartition(DEVICE_MARK)[0] if is_qualified(name) and DEVICE_MARK in name else name


# What torch's Python layer does differently when the group's backend is a qualified string, for every
# backend serving a device of one (measured on torch 2.13 with cpu:gloo at ws2: c10d and p2p).
QUALIFIED_GAPS: tuple[Gap, ...] = (
    MONITORED_BARRIER_GLOO_ONLY,  # dist.get_backend() is the string, never 'gloo'
)
# torch 2.13's _new_process_group_helper sets a qualified group's default backend type to NCCL if the string
# names it, else, as soon as any plugin is registered (the harness always registers the reference), to CUSTOM
# only if the string names the first registered plugin, else never (``_sets_default_backend``). Measured:
# cpu:gloo fails so, cpu:reference (the first plugin) counts its collectives.
UNDEFINED_DEFAULT_BACKEND = Gap(
    {"feature": "work_sequence_number"},
    "with a device-qualified backend string torch 2.13 leaves the group's default backend type UNDEFINED when the "
    "string names neither NCCL nor the first registered plugin (its gloo fallback is skipped once any plugin is "
    "registered): _get_sequence_number_for_group fails with 'RuntimeError: ProcessGroup undefined does not yet "
    "support sequence numbers.' (cpu:gloo, torch 2.13)")


# A string naming NCCL and a CPU backend: the group's sequence number and its barrier belong to one backend each,
# so the other device's world sees them differ (measured on an H200, torch 2.11, cpu:gloo,cuda:nccl at ws1).
SEQUENCE_IS_NCCLS = Gap(
    {"feature": "work_sequence_number"},
    "a group made with a string naming NCCL counts NCCL's collectives only: _get_sequence_number_for_group answers "
    "the default backend's (NCCL's) number, which the CPU backend's collectives leave unchanged ('all_reduce: the "
    "sequence number went from 0 to 0, expected 1' on cpu:gloo,cuda:nccl@cpu; torch 2.11)")
BARRIER_ON_CPU = Gap(
    {"feature": "work_sequence_number", "collective": "barrier"},
    "dist.barrier() on a group made with cpu:gloo,cuda:nccl runs on the CPU backend, so NCCL's sequence number does "
    "not move ('barrier: the sequence number went from 12 to 12, expected 13' on cpu:gloo,cuda:nccl@cuda; "
    "torch 2.11)")


# A string naming two backends that both run here (cpu:reference,cuda:gloo, measured on torch 2.14.1 at ws2: c10d
# and p2p). torch 2.14 answers the group's own calls with its default backend, the one of the device it prefers
# (_get_default_backend_type_for_backend_config: the accelerator's, else the first non-CPU device's the string
# names), so the other devices' worlds see that backend's answers.
SEVERAL_BACKENDS_NO_RECONFIGURE = Gap(
    {"feature": "reconfigure"},
    "torch refuses to reconfigure a group of several backends: 'RuntimeError: ProcessGroup reconfigure APIs do not "
    "support process groups with multiple backends.' (torch 2.14.1, cpu:reference,cuda:gloo; "
    "test_a_group_of_several_backends_is_refused holds every backend to that)", torch=">=2.14")
DEFAULT_BACKEND_ANSWERS = Gap(
    {"feature": ("work_sequence_number", "completion_hook", "pending_works", "shrinking")},
    "torch 2.14 answers a group's own calls with its default backend, the one of the device it prefers (an "
    "accelerator's, else the first non-CPU device's the string names: gloo in cpu:<it>,cuda:gloo), not the backend "
    "serving this world's device: its sequence number is gloo's, which this device's collectives leave unchanged "
    "('all_reduce: the sequence number went from 0 to 0, expected 1'), completion hooks and _wait_for_pending_works "
    "are refused ('RuntimeError: Only ProcessGrouppNCCL supports onCompletion hook, but got gloo backend.'), and "
    "shrink_group asks gloo (\"TypeError: Process group backend for '1' does not support shrinking operations.\"); "
    "torch 2.14.1", torch=">=2.14")


def type_slot(backend: str) -> str:
    """The c10d backend type torch files a string's backend under: its own for the built-in ones, CUSTOM for
    every registered plugin (``Backend.backend_type_map``)."""
    import torch.distributed as dist

    known = dist.Backend.backend_type_map.get(backend.lower())
    return known.name if known is not None else "CUSTOM"


def _served_instead(serving_part: DevicePart, runnable: list[DevicePart], specs: dict) -> DevicePart | None:
    """The part named earlier in the string whose backend torch registers for ``serving_part``'s device too:
    a group keeps one backend per backend type, the first registered (ProcessGroup::_register_backend), so a
    second plugin (CUSTOM, like the first) never serves its device."""
    mine = specs[serving_part].init_backend
    for part in runnable:
        if part == serving_part:
            return None
        if specs[part].init_backend != mine and type_slot(specs[part].init_backend) == type_slot(mine):
            return part
    return None


def default_device(parts: tuple[DevicePart, ...]) -> str:
    """The device whose backend torch 2.14 makes a group's default (no device_id): the accelerator's if the
    string names it, else the first non-CPU device named, else the first named."""
    import torch

    accelerator = torch.accelerator.current_accelerator()
    devices = [p.device for p in parts]
    if accelerator is not None and accelerator.type in devices:
        return accelerator.type
    return next((d for d in devices if d != "cpu"), devices[0])


def _shared_with(serving: BackendSpec, named: list[str], runnable: list[DevicePart],
                 specs: dict) -> tuple[Gap, ...]:
    """The gaps of one device's world of a string that also names another device's backend (``named``: the
    runnable parts' backends, lower case, in their order)."""
    if len(set(named)) < 2:
        return ()
    if "nccl" in named:  # measured on a GPU (torch 2.11)
        return (BARRIER_ON_CPU,) if serving.init_backend.lower() == "nccl" else (SEQUENCE_IS_NCCLS,)
    shared = (SEVERAL_BACKENDS_NO_RECONFIGURE,) + tuple(serving.gaps_beside_other_backends)
    default = next(p for p in runnable if p.device == default_device(tuple(runnable)))
    # the group's own calls go to the backend of the default device's type: this world's own where it shares it
    answers_for_us = type_slot(specs[default].init_backend) == type_slot(serving.init_backend)
    return shared + (() if answers_for_us else (DEFAULT_BACKEND_ANSWERS,))


def _sets_default_backend(backends: list[str]) -> bool:
    """Whether torch gives a group created with a qualified string naming ``backends`` a default backend type."""
    import torch.distributed as dist

    plugins = [name.lower() for name in getattr(dist.Backend, "_plugins", {})]
    return "nccl" in backends or not plugins or plugins[0] in backends


def device_spec(name: str, lookup: Callable[[str], BackendSpec]) -> BackendSpec:
    """The spec of the world of target ``name`` (a qualified string, or ``<string>@<device>``).

    It is the spec of the backend serving that device (``lookup`` resolves a plain backend name), renamed,
    on that device, initialised with the string's parts that can run here, with QUALIFIED_GAPS first."""
    given = given_string(name)
    parts = parse(given)
    device = name[len(given) + 1:] if name != given else parts[0].device
    serving_part = next((p for p in parts if p.device == device), None)
    if serving_part is None:
        raise BadBackendString(f"{name!r}: backend string {given!r} names no device {device!r}")
    specs = {p: lookup(p.backend) for p in parts}
    serving = specs[serving_part]
    runnable = [p for p in parts if p == serving_part or specs[p].availability().available]
    dropped = [f"{p} ({specs[p].availability().reason})" for p in parts if p not in runnable]
    init = ",".join(f"{p.device}:{specs[p].init_backend}" for p in runnable)
    rank_env = {key: value for p in runnable for key, value in specs[p].rank_env.items()}
    description = f"{serving_part} of {given!r}: {serving.description}; the world is initialised with {init!r}"
    if dropped:
        description += f", without {', '.join(dropped)}"
    named = [specs[p].init_backend.lower() for p in runnable]
    gaps = QUALIFIED_GAPS + (() if _sets_default_backend(named) else (UNDEFINED_DEFAULT_BACKEND,))
    gaps += _shared_with(serving, named, runnable, specs)
    instead = _served_instead(serving_part, runnable, specs)
    return replace(serving, name=name, device_type=device, torch_backend=init, rank_env=rank_env,
                   gaps=gaps + tuple(serving.gaps), description=description,
                   check_available=_availability_of(serving_part, serving, instead, given))


def _availability_of(part: DevicePart, serving: BackendSpec, instead: DevicePart | None = None,
                     given: str = "") -> Callable[[], Availability]:
    def check() -> Availability:
        if instead is not None:
            return Availability(False, (
                f"{part}: torch never lets {part.backend} serve {part.device} in {given!r}: a group keeps one backend "
                f"per backend type, the first registered, and {part.backend} and {instead.backend} are both CUSTOM "
                f"(plugins), so {instead.backend} serves {part.device} too (measured: 'cpu:native,dcdev:native-dcdev' "
                "serves dcdev by native on torch 2.13, 'cpu:mine,cuda:theirs' cuda by mine on 2.14.1; a string routes "
                "per device where at most one of its backends is a plugin)"))
        availability = serving.availability()
        if availability.available:
            return availability
        return Availability(False, f"{part}: {availability.reason}")
    return check
