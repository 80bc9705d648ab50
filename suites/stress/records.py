"""The benchmarks' rows as typed, frozen records, and their JSON.

``CollectiveRow`` is one row of python -m suites.stress.collectives (nccl-tests'
columns); ``RpcRecord`` one measurement of python -m suites.stress.rpc (light,
heavy or train; profiled or not); ``BaselineRecord`` the part of an RPC record
a regression check compares. Each ``to_json()`` writes exactly the keys, key
order and values collectives.json and stress.json have always had, so the
files, and the CSV and plots reports/benchmarks.py makes from them, do not
change; ``from_json()`` reads them back and raises ``RecordError`` naming the
record and the key when a value is not what the tool writes.

reports/ reads these files as plain dicts on purpose: it may import nothing of
the project (docs/architecture.md, the layers), and a report must survive a
hand-edited file where these readers refuse it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class RecordError(ValueError):
    """A JSON value that is not a benchmark record; the message names where and what."""


# ------------------------------------------------------------------ checked reading
Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a count


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _or_none(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _list_of(check: Check) -> Check:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


EXPECTED: dict[Check, str] = {_is_int: "an integer", _is_number: "a number", _is_str: "a string", _is_bool: "true or false"}


def _show(value: Any) -> str:
    text = json.dumps(value, allow_nan=True, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


class Fields:
    """The keys of one JSON object, each read with the check its field needs."""

    def __init__(self, data: Any, what: str):
        if not isinstance(data, Mapping):
            raise RecordError(f"{what} is {_show(data)}, expected an object")
        self.data = data
        self.what = what

    def get(self, key: str, check: Check, expected: str = "") -> Any:
        if key not in self.data:
            raise RecordError(f"{self.what} lacks {key!r}")
        value = self.data[key]
        if not check(value):
            raise RecordError(f"{self.what}: {key!r} is {_show(value)}, expected {expected or EXPECTED[check]}")
        return value

    def number(self, key: str) -> float:
        return self.get(key, _is_number)

    def number_or_none(self, key: str) -> float | None:
        return self.get(key, _or_none(_is_number), "a number or null")

    def numbers(self, key: str, *, nullable: bool = False) -> tuple:
        check = _list_of(_or_none(_is_number) if nullable else _is_number)
        return tuple(self.get(key, check, "a list of numbers" + (" or nulls" if nullable else "")))

    def numbers_or_none(self, key: str) -> tuple | None:
        value = self.get(key, _or_none(_list_of(_is_number)), "a list of numbers or null")
        return None if value is None else tuple(value)

    def same(self, key: str, value: Any, as_key: str) -> None:
        """A key that repeats another field's value (kept for the files' readers) must still equal it."""
        found = self.get(key, _or_none(_is_number), "a number or null")
        both_nan = all(isinstance(v, float) and math.isnan(v) for v in (found, value))  # NaN != NaN
        if found != value and not both_nan:
            raise RecordError(f"{self.what}: {key!r} is {_show(found)} but {as_key!r} is {_show(value)}: "
                              "they are one figure")


def _numbers(values: tuple | None) -> list | None:
    return None if values is None else list(values)


# ------------------------------------------------------------------ files
def load_document(path: str, written_by: str = "a distconform benchmark") -> dict:
    """A benchmark JSON file's top-level object, or RecordError saying why it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # json.JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        raise RecordError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise RecordError(f"{path} has no list of records (expected a file written by {written_by})")
    return data


def read_collectives(path: str) -> list[CollectiveRow]:
    """The rows of a collectives.json file."""
    return [CollectiveRow.from_json(r, f"{path}: record {i}") for i, r in enumerate(load_document(path)["records"])]


def read_stress(path: str) -> list[RpcRecord]:
    """The records of a stress.json file (or of a baseline written by --write-baseline)."""
    return [RpcRecord.from_json(r, f"{path}: record {i}") for i, r in enumerate(load_document(path)["records"])]


# ------------------------------------------------------------------ collectives
@dataclass(frozen=True)
class CollectiveRow:
    """One row of the collective benchmark: a (backend, world size, collective, size) measured.

    Times are per iteration, the maximum over ranks; nccl-tests' ``time`` column is the p50.
    """

    backend: str
    world_size: int
    collective: str  # the benchmark's name (nccl-tests' where it has one)
    size: int  # bytes, nccl-tests' definition per collective (suites/stress/metrics.py)
    count: int  # elements
    dtype: str  # JSON "type"
    redop: str  # "sum" or "none"
    root: int  # 0 for rooted collectives, else -1
    p50_us: float
    p99_us: float
    algbw: float  # GB/s from the p50 (inf when the p50 is 0)
    busbw: float
    bus_factor: float
    wrong: int  # JSON "#wrong": elements differing from the oracle, summed over ranks
    iters: int
    warmup: int
    wall_s: float  # the controller's wall time for the row, warm-ups and the check included

    @property
    def time_us(self) -> float:
        return self.p50_us

    def to_json(self) -> dict:
        return {"backend": self.backend, "world_size": self.world_size, "collective": self.collective,
                "size": self.size, "count": self.count, "type": self.dtype, "redop": self.redop, "root": self.root,
                "time_us": self.time_us, "p50_us": self.p50_us, "p99_us": self.p99_us, "algbw": self.algbw,
                "busbw": self.busbw, "bus_factor": self.bus_factor, "#wrong": self.wrong, "iters": self.iters,
                "warmup": self.warmup, "wall_s": self.wall_s}

    @classmethod
    def from_json(cls, data: Any, what: str = "a collectives record") -> CollectiveRow:
        f = Fields(data, what)
        row = cls(backend=f.get("backend", _is_str), world_size=f.get("world_size", _is_int),
                  collective=f.get("collective", _is_str), size=f.get("size", _is_int),
                  count=f.get("count", _is_int), dtype=f.get("type", _is_str), redop=f.get("redop", _is_str),
                  root=f.get("root", _is_int), p50_us=f.number("p50_us"), p99_us=f.number("p99_us"),
                  algbw=f.number("algbw"), busbw=f.number("busbw"), bus_factor=f.number("bus_factor"),
                  wrong=f.get("#wrong", _is_int), iters=f.get("iters", _is_int), warmup=f.get("warmup", _is_int),
                  wall_s=f.number("wall_s"))
        f.same("time_us", row.p50_us, "p50_us")
        return row


# ------------------------------------------------------------------ RPC
@dataclass(frozen=True)
class RpcKey:
    """What one RPC measurement is of: it names a record in a run, a baseline and the tables."""

    agent: str
    backend: str
    world_size: int
    benchmark: str  # light, heavy, train
    mode: str  # async, sync; train: step
    profiled: bool

    def to_json(self) -> dict:
        return {"agent": self.agent, "backend": self.backend, "world_size": self.world_size,
                "benchmark": self.benchmark, "mode": self.mode, "profiled": self.profiled}

    @classmethod
    def from_json(cls, data: Any, what: str = "an RPC record") -> RpcKey:
        f = Fields(data, what)
        return cls(agent=f.get("agent", _is_str), backend=f.get("backend", _is_str),
                   world_size=f.get("world_size", _is_int), benchmark=f.get("benchmark", _is_str),
                   mode=f.get("mode", _is_str), profiled=f.get("profiled", _is_bool))

    def describe(self) -> str:
        return (f"{self.agent} {self.backend} ws{self.world_size} {self.benchmark} {self.mode}"
                f"{' profiled' if self.profiled else ''}")


KEY_FIELDS = tuple(RpcKey.__dataclass_fields__)  # the keys that name a record, in the files' order


@dataclass(frozen=True)
class RpcProfile:
    """What the legacy profiler saw in a profiled run, summed over ranks (exit_seconds: the slowest rank's)."""

    events: int
    rpc_records: int
    remote_events: int
    exit_seconds: float

    def to_json(self) -> dict:
        return {"events": self.events, "rpc_records": self.rpc_records, "remote_events": self.remote_events,
                "exit_seconds": self.exit_seconds}

    @classmethod
    def from_json(cls, data: Any, what: str) -> RpcProfile:
        f = Fields(data, what)
        return cls(events=f.get("events", _is_int), rpc_records=f.get("rpc_records", _is_int),
                   remote_events=f.get("remote_events", _is_int), exit_seconds=f.number("exit_seconds"))


@dataclass(frozen=True)
class RepeatFigures:
    """One of --repeat runs' figures, kept beside the fastest run's record."""

    rpcs_per_s: float | None
    p50_us: float | None
    p99_us: float | None
    seconds: float

    def to_json(self) -> dict:
        return {"rpcs_per_s": self.rpcs_per_s, "p50_us": self.p50_us, "p99_us": self.p99_us, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Any, what: str) -> RepeatFigures:
        f = Fields(data, what)
        return cls(rpcs_per_s=f.number_or_none("rpcs_per_s"), p50_us=f.number_or_none("p50_us"),
                   p99_us=f.number_or_none("p99_us"), seconds=f.number("seconds"))


@dataclass(frozen=True)
class RpcRecord:
    """One RPC benchmark measurement (suites/stress/rpc_figures.py makes it from the ranks' results).

    ``rpcs_per_s`` is calls over the slowest timed rank's seconds (train: steps per second per trainer);
    ``p50_us``/``p99_us`` the worst rank's percentiles of the sync loop or of the training steps, None for async.
    The last four fields are filled after the measurement: every repeat's figures, the wall time, and
    the ratios only the whole run gives (x tensorpipe in the same world; profiled over unprofiled time).
    """

    key: RpcKey
    calls: int  # RPCs per rank; train: steps per trainer
    warmup: int
    rpcs_per_s: float | None
    p50_us: float | None
    p99_us: float | None
    seconds: float
    per_rank_rpcs_per_s: tuple[float | None, ...]
    per_rank_seconds: tuple[float, ...]
    per_rank_p50_us: tuple[float, ...] | None
    per_rank_p99_us: tuple[float, ...] | None
    wrong: int
    profile: RpcProfile | None = None  # exactly when key.profiled
    repeats: tuple[RepeatFigures, ...] = ()
    wall_s: float | None = None
    x_tensorpipe: float | None = None
    overhead: float | None = None  # profiled records only: profiled seconds / unprofiled seconds

    @property
    def steps_per_s(self) -> float | None:
        """The train benchmark's name for its rate (the JSON has both keys)."""
        return self.rpcs_per_s

    def figures(self) -> RepeatFigures:
        return RepeatFigures(self.rpcs_per_s, self.p50_us, self.p99_us, self.seconds)

    def to_json(self) -> dict:
        data = self.key.to_json()
        data.update({
            "calls": self.calls, "warmup": self.warmup, "rpcs_per_s": self.rpcs_per_s, "p50_us": self.p50_us,
            "p99_us": self.p99_us, "seconds": self.seconds, "per_rank_rpcs_per_s": list(self.per_rank_rpcs_per_s),
            "per_rank_seconds": list(self.per_rank_seconds), "per_rank_p50_us": _numbers(self.per_rank_p50_us),
            "per_rank_p99_us": _numbers(self.per_rank_p99_us), "wrong": self.wrong,
        })
        if self.key.benchmark == "train":
            data["steps_per_s"] = self.steps_per_s
        if self.key.profiled:
            data["profile"] = None if self.profile is None else self.profile.to_json()
        data["repeats"] = [r.to_json() for r in self.repeats]
        data["wall_s"] = self.wall_s
        data["x_tensorpipe"] = self.x_tensorpipe
        if self.key.profiled:
            data["overhead"] = self.overhead
        return data

    @classmethod
    def from_json(cls, data: Any, what: str = "an RPC record") -> RpcRecord:
        key = RpcKey.from_json(data, what)
        f = Fields(data, what)
        profile = None
        if key.profiled:
            profile = RpcProfile.from_json(f.get("profile", lambda v: isinstance(v, dict), "an object"),
                                           f"{what}: 'profile'")
        repeats = f.get("repeats", _list_of(lambda v: isinstance(v, dict)), "a list of objects")
        record = cls(
            key=key, calls=f.get("calls", _is_int), warmup=f.get("warmup", _is_int),
            rpcs_per_s=f.number_or_none("rpcs_per_s"), p50_us=f.number_or_none("p50_us"),
            p99_us=f.number_or_none("p99_us"), seconds=f.number("seconds"),
            per_rank_rpcs_per_s=f.numbers("per_rank_rpcs_per_s", nullable=True),
            per_rank_seconds=f.numbers("per_rank_seconds"), per_rank_p50_us=f.numbers_or_none("per_rank_p50_us"),
            per_rank_p99_us=f.numbers_or_none("per_rank_p99_us"), wrong=f.get("wrong", _is_int), profile=profile,
            repeats=tuple(RepeatFigures.from_json(r, f"{what}: repeat {i}") for i, r in enumerate(repeats)),
            wall_s=f.number_or_none("wall_s"), x_tensorpipe=f.number_or_none("x_tensorpipe"),
            overhead=f.number_or_none("overhead") if key.profiled else None)
        if key.benchmark == "train":
            f.same("steps_per_s", record.rpcs_per_s, "rpcs_per_s")
        return record


@dataclass(frozen=True)
class BaselineRecord:
    """What a regression check reads of a baseline's record: the key, the call count and two figures.

    Any stress.json or --write-baseline file has these; a baseline written by hand needs nothing more.
    """

    key: RpcKey
    calls: int
    rpcs_per_s: float | None
    p50_us: float | None

    @classmethod
    def from_json(cls, data: Any, what: str) -> BaselineRecord:
        if isinstance(data, Mapping):  # every missing key at once: the fix is to the whole record
            missing = [k for k in KEY_FIELDS + ("calls", "rpcs_per_s", "p50_us") if k not in data]
            if missing:
                raise RecordError(f"{what}: a record lacks {', '.join(missing)}: {_show(data)}")
        f = Fields(data, what)
        return cls(key=RpcKey.from_json(data, what), calls=f.get("calls", _is_int),
                   rpcs_per_s=f.number_or_none("rpcs_per_s"), p50_us=f.number_or_none("p50_us"))


@dataclass(frozen=True)
class Baseline:
    """A baseline file: how it was made (when it says) and its records."""

    path: str
    command: str
    host: dict
    records: tuple[BaselineRecord, ...]


def read_baseline(path: str) -> Baseline:
    """A baseline written by --write-baseline, or any stress.json of the RPC benchmark."""
    data = load_document(path, "--write-baseline")
    records = tuple(BaselineRecord.from_json(r, path) for r in data["records"])
    command = data.get("command")
    host = data.get("host")
    return Baseline(path, command if isinstance(command, str) else "", host if isinstance(host, dict) else {},
                    records)
