"""The numbers of the collective benchmark, as nccl-tests defines them.

nccl-tests (doc/PERFORMANCE.md and src/*.cu) reports, per operation size:

* ``size``: bytes of the operation. For all_reduce and broadcast (and reduce)
  it is the buffer; for all_gather the gathered output (n x per-rank count);
  for reduce_scatter the input (n x per-rank output count); for all_to_all the
  total each rank sends (n x per-peer count, its own chunk included).
* ``count``: ``size`` in elements.
* ``algbw = size / time`` in GB/s (1 GB = 1e9 bytes).
* ``busbw = algbw x factor``, the factor making the figure comparable to the
  hardware's peak whatever the rank count: all_reduce 2(n-1)/n; all_gather,
  reduce_scatter, all_to_all, gather, scatter (n-1)/n; broadcast and reduce 1.

Which collectives exist, their buffers and bus factors come from the one
table, suites/collectives.py. A benchmark name (nccl-tests' for the one-tensor
forms: all_gather is all_gather_into_tensor; ``*_list`` for torch's list
forms) is what the user types and what the report shows; ``entry`` turns it
into the table's record once, at the command line, and everything after takes
the record. This module is pure arithmetic (no torch), so it is unit-tested directly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from suites import collectives as table

# nccl-tests' default set; every other collective of the table on request (--collectives)
DEFAULT_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def collective_names() -> list[str]:
    """Every collective of the table, by its benchmark name."""
    return table.bench_names()


def entry(collective: str) -> table.Collective:
    """The table's record for a benchmark name (ValueError naming the known ones)."""
    return table.by_bench_name(collective)


def bus_factor(record: table.Collective, world_size: int) -> float:
    """busbw / algbw, exactly as nccl-tests: 2(n-1)/n, (n-1)/n or 1 (the table's ``bus_factor``)."""
    return record.bus_factor(world_size)


@dataclass(frozen=True)
class Layout:
    """The buffers of one benchmark row on every rank."""

    record: table.Collective
    world_size: int
    elem_size: int
    chunk: int  # per-rank count (all_gather input, reduce_scatter output, all_to_all per peer); else the count
    in_numel: int  # elements of each rank's input
    out_numel: int  # elements of each rank's output

    @property
    def count(self) -> int:
        """The ``count`` column: elements of ``size``."""
        if self.record.partitioned:
            return self.world_size * self.chunk
        return self.chunk

    @property
    def size(self) -> int:
        """The ``size`` column in bytes (nccl-tests' definition, see the module docstring)."""
        return self.count * self.elem_size


def layout(record: table.Collective, nbytes: int, world_size: int, elem_size: int) -> Layout:
    """Buffers for a nominal size of ``nbytes``.

    As in nccl-tests the per-rank count of a partitioned collective is rounded
    down to a multiple of the world size (at least one element each), so the
    reported ``size`` can be a little off the nominal one (e.g. 64 MiB / 3 ranks).
    """
    n = world_size
    count = max(1, nbytes // elem_size)
    chunk = max(1, count // n) if record.partitioned else count
    in_numel = chunk * record.inputs.count(n)
    out_numel = in_numel if record.in_place else chunk * record.outputs.count(n)
    return Layout(record, n, elem_size, chunk, in_numel, out_numel)


def algbw(size_bytes: int, seconds: float) -> float:
    """GB/s (1e9 bytes per second), nccl-tests' algorithm bandwidth."""
    return size_bytes / 1e9 / seconds if seconds > 0 else float("inf")


def busbw(record: table.Collective, world_size: int, size_bytes: int, seconds: float) -> float:
    return algbw(size_bytes, seconds) * bus_factor(record, world_size)


def percentile(samples, p: float) -> float:
    """Nearest-rank percentile: always one of the measured values (p99 of 20 samples is the max)."""
    values = sorted(samples)
    if not values:
        raise ValueError("percentile of no samples")
    rank = max(1, math.ceil(p / 100.0 * len(values)))
    return values[min(rank, len(values)) - 1]


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_bytes(text: str) -> int:
    """'8', '4K', '64M', '1G' (binary units, as nccl-tests' -b/-e) -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (expected e.g. 8, 4K, 64M)")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def size_sweep(min_bytes: int, max_bytes: int, factor: int, extra=()) -> list[int]:
    """min, min*f, min*f^2, ... <= max, plus max itself and any ``extra`` size within range."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min-bytes <= max-bytes, got {min_bytes} and {max_bytes}")
    if factor < 2:
        raise ValueError(f"step factor must be >= 2, got {factor}")
    sizes = set()
    size = min_bytes
    while size <= max_bytes:
        sizes.add(size)
        size *= factor
    sizes.add(max_bytes)
    sizes.update(s for s in extra if min_bytes <= s <= max_bytes)
    return sorted(sizes)


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
