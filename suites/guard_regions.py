"""Tensors inside guard regions, as Open MPI's alltoallv validation places every buffer.

The tensor a call gets is a view at storage offset ``GUARD`` of a larger 1-D
buffer with ``GUARD`` more elements of slack after it; the slack holds
``SENTINEL``. A backend that writes one element past (or before) the tensor it
was given, or uses the memory around it as scratch, changes a guard element.
In a tightly sized tensor such a write has nowhere visible to go (in C it
silently corrupts the heap): the guard is what makes it observable.

The rank side returns the whole buffer; the controller checks the view and
the guards (``expect_guarded``). Values: ``values_of`` stays below 61 and
reductions of it over at most four ranks below 250 in every dtype the suites
use here (uint8 included), so neither ``SENTINEL`` nor ``UNWRITTEN`` (an
output's initial fill) is ever a correct result.
"""

from __future__ import annotations

import torch

from suites import values
from suites.checks import expect_tensor

GUARD = 3  # elements of slack on either side of every tensor
SENTINEL = 255  # what the slack holds
UNWRITTEN = 254  # an output's initial fill: no correct result equals it


def values_of(dtype: str, rank: int, slot: int, shape: tuple) -> torch.Tensor:
    """Rank ``rank``'s data number ``slot`` (what it sends to ``slot``, or its list entry ``slot``).

    Element k is (31 * rank + 7 * slot + k) mod 61: different for every (rank, slot) of a
    world of up to four ranks, and a sum over four ranks (< 244) stays exact even in uint8.
    """
    numel = 1
    for dim in shape:
        numel *= dim
    flat = (torch.arange(numel, dtype=torch.int64) + 31 * rank + 7 * slot) % 61
    return flat.to(values.DTYPES[dtype]).reshape(shape)


def unwritten(dtype: str, shape: tuple) -> torch.Tensor:
    return torch.full(shape, UNWRITTEN, dtype=values.DTYPES[dtype])


def guarded(data: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, buffer): a copy of ``data`` at storage offset GUARD of a buffer with GUARD slack elements after it."""
    numel = data.numel()
    buffer = torch.full((GUARD + numel + GUARD,), SENTINEL, dtype=data.dtype, device=device)
    view = buffer[GUARD:GUARD + numel].view(data.shape)
    view.copy_(data)
    return view, buffer


def inside(buffer: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The tensor a ``guarded`` buffer of that shape holds (controller side, on the returned buffer)."""
    numel = buffer.numel() - 2 * GUARD
    return buffer[GUARD:GUARD + numel].view(shape)


def expect_guards(buffer: torch.Tensor, what: str) -> None:
    """The slack before and after the tensor in ``buffer`` still holds SENTINEL everywhere."""
    numel = buffer.numel() - 2 * GUARD
    for side, slack in (("before", buffer[:GUARD].flip(0)), ("past", buffer[GUARD + numel:])):
        changed = (slack != SENTINEL).nonzero().reshape(-1)
        if changed.numel():
            first = int(changed[0])
            raise AssertionError(
                f"{what}: the backend wrote {side} the tensor it was given: guard element {first + 1} {side} it "
                f"holds {slack[first].item()!r}, not the sentinel {SENTINEL} ({changed.numel()} of {GUARD} guard "
                f"elements {side} it changed)")


def expect_guarded(buffer: torch.Tensor, expected: torch.Tensor | None, what: str) -> None:
    """The tensor inside ``buffer`` equals ``expected`` (None: unspecified) and its guards are intact."""
    expect_guards(buffer, what)
    if expected is not None:
        expect_tensor(inside(buffer, tuple(expected.shape)), expected, what)
