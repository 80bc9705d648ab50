"""What every rank runs for one benchmark row (module-level, so World.run can send it).

One call measures one (collective, size): fill the inputs, warm up, agree on
an iteration count, barrier, time every iteration (op + wait) with
time.perf_counter(), then re-fill the inputs, run the operation once more and
count the elements that differ from the oracle (backends/reference/semantics.py),
as nccl-tests does after its timed loop.

Inputs are small integers, so every reduction is exact in the chosen dtype
and the expected result is known in closed form: element i of rank r is
``((i + 31 r) mod M) + 1`` with M chosen so that the sum over all ranks
stays exactly representable.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites.collectives import Args, Collective
from suites.stress.metrics import layout

# Largest integer up to which every integer is exactly representable.
_EXACT_UP_TO = {
    torch.float64: 2 ** 53, torch.float32: 2 ** 24, torch.float16: 2 ** 11, torch.bfloat16: 2 ** 8,
    torch.int64: 2 ** 62, torch.int32: 2 ** 30, torch.int16: 2 ** 14, torch.int8: 127, torch.uint8: 255,
}
ROOT = 0  # of broadcast and reduce, as nccl-tests' default


def fill_modulus(dtype: torch.dtype, world_size: int) -> int:
    """M such that a sum of ``world_size`` values in 1..M is exact in ``dtype``."""
    modulus = max(1, min(251, _EXACT_UP_TO.get(dtype, 2 ** 8) // max(1, world_size)))
    if modulus > 1 and modulus % 31 == 0:  # keep neighbouring ranks' patterns distinct
        modulus -= 1
    return modulus


def _period(rank: int, start: int, length: int, dtype: torch.dtype, modulus: int, device="cpu") -> torch.Tensor:
    """Elements ``start .. start+min(length, modulus)`` of rank ``rank``'s input: one full period."""
    index = torch.arange(start, start + min(length, modulus), dtype=torch.int64, device=device)
    return ((index + 31 * rank) % modulus + 1).to(dtype)


def _tile(period: torch.Tensor, length: int) -> torch.Tensor:
    """Repeat ``period`` to ``length`` elements (the inputs are periodic, so is every expected output)."""
    if period.numel() >= length:
        return period[:length].clone()
    return period.repeat(-(-length // period.numel()))[:length].contiguous()


def rank_input(rank: int, numel: int, dtype: torch.dtype, modulus: int, device="cpu") -> torch.Tensor:
    """Element i of rank r's input: ((i + 31 r) mod M) + 1, periodic in i with period M."""
    return _tile(_period(rank, 0, numel, dtype, modulus, device), numel)


def expected_output(record: Collective, rank: int, world_size: int, lay, dtype: torch.dtype,
                    modulus: int) -> torch.Tensor | None:
    """What ``rank`` must hold after the collective, from the table's oracle; None: nothing to check.

    Every input, and every chunk of one, is periodic with period M, and the
    collectives act elementwise within chunks, so the oracle
    (backends/reference/semantics.py, through suites/collectives.py) is
    applied to one period of each chunk and its answer tiled to full length:
    exact, and cheap at 64 MiB.
    """
    n = world_size
    chunks = record.inputs.count(n)
    size = lay.in_numel // chunks  # chunk k of rank r's input starts at element k * size
    inputs = [[_period(r, k * size, size, dtype, modulus) for k in range(chunks)]
              if record.inputs.passed_by(r == ROOT) else [] for r in range(n)]
    out = record.oracle(inputs, "sum" if record.reduces else None, ROOT if record.rooted else None)[rank]
    if not out or any(chunk is None for chunk in out):
        return None  # no output on this rank (gather's non-roots) or an unspecified one (reduce's)
    return torch.cat([_tile(chunk, lay.out_numel // len(out)) for chunk in out])


def _sides(flat: torch.Tensor, slots, n: int) -> list:
    """What this rank passes for ``slots``: views of its flat buffer (chunks of it for a list)."""
    if slots is None or not slots.passed_by(ctx.rank == ROOT):
        return []
    return list(flat.chunk(slots.count(n))) if slots.packing == "list" else [flat]


class _Buffers:
    """Input/output tensors of one row and the call that runs the collective on them."""

    def __init__(self, record: Collective, lay, dtype, modulus: int, device):
        self.record, self.lay, self.dtype, self.modulus, self.device = record, lay, dtype, modulus, device
        self.input = rank_input(ctx.rank, lay.in_numel, dtype, modulus, device)
        self.in_place = record.in_place
        self.output = self.input if self.in_place else torch.empty(lay.out_numel, dtype=dtype, device=device)
        n = ctx.world_size
        # views into input/output: refill() rewrites them in place, every iteration reuses them
        self.args = Args(_sides(self.input, record.inputs, n), _sides(self.output, record.outputs, n),
                         op=dist.ReduceOp.SUM if record.reduces else None, root=ROOT if record.rooted else None,
                         async_op=True)

    def refill(self) -> None:
        """Fresh inputs and a sentinel output (every expected value is >= 1) before the checked run."""
        self.input.copy_(rank_input(ctx.rank, self.lay.in_numel, self.dtype, self.modulus, self.device))
        if not self.in_place:
            self.output.zero_()

    def start(self):
        return self.record.issue(self.args)


def _synchronizer(device: torch.device):
    if device.type == "cpu":
        return lambda: None
    module = getattr(torch, device.type)
    return lambda: module.synchronize(device)


def bench_row(record: Collective, nbytes: int, dtype_name: str, *, warmup: int, max_iters: int,
              min_iters: int, target_seconds: float, warmup_seconds: float = 0.05) -> dict:
    """Time one (collective, size) on this rank; return its samples and wrong-element count.

    ``record``: the table's record itself, sent to the rank (its functions are module-level, so it pickles
    by reference; a plugin's entry is imported on every rank with the plugin)."""
    dtype = getattr(torch, dtype_name)
    n, rank = ctx.world_size, ctx.rank
    device = ctx.tensor_device()
    elem_size = torch.empty((), dtype=dtype).element_size()
    lay = layout(record, nbytes, n, elem_size)
    modulus = fill_modulus(dtype, n)
    buffers = _Buffers(record, lay, dtype, modulus, device)
    sync = _synchronizer(device)

    def once() -> float:
        start = time.perf_counter()
        work = buffers.start()
        if work is not None:
            work.wait()
        sync()
        return time.perf_counter() - start

    # Warm-up and calibration. Every rank must run the same number of
    # iterations, so rank 0 decides and the plan goes through the case's store:
    # the first (cold) operation sizes the warm-up, the warm-ups' median sizes
    # the timed loop.
    dist.barrier()
    first = once()
    if rank == 0:
        ctx.store.set("warmup", str(max(0, min(warmup - 1, int(warmup_seconds / max(first, 1e-6))))))
    more_warmup = int(ctx.store.get("warmup"))
    warm = [once() for _ in range(more_warmup)] or [first]
    if rank == 0:
        per_op = max(sorted(warm)[len(warm) // 2], 1e-6)
        ctx.store.set("iters", str(max(min_iters, min(max_iters, int(target_seconds / per_op)))))
    iters = int(ctx.store.get("iters"))

    dist.barrier()
    samples = [once() for _ in range(iters)]

    # Correctness, after the timed loop: fresh inputs, one more operation, compare.
    buffers.refill()
    dist.barrier()
    once()
    expected = expected_output(record, rank, n, lay, dtype, modulus)
    wrong = 0
    if expected is not None:
        got = buffers.output.cpu()
        wrong = int((got != expected).sum()) if got.shape == expected.shape else int(expected.numel())
    return {"samples": samples, "iters": iters, "warmup": 1 + more_warmup, "wrong": wrong,
            "size": lay.size, "count": lay.count, "elem_size": elem_size}
