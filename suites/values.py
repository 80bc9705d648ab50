"""Deterministic per-rank inputs and their closed-form reductions.

Inputs are chosen so every reduction is exact in its own dtype, whatever the
order a backend combines ranks in; any difference is therefore a bug, never
rounding. They are also chosen to expose the classic shortcuts:

* float64 inputs carry 2**-40 steps, lost if a backend reduces in float32;
  float32 inputs carry 2**-16 steps, lost in float16/bfloat16.
* int64 inputs sit at 2**55 + small, not representable in float64, so a
  backend that reduces integers through double gets the low bits wrong.
* min/max winners move between ranks element by element, so "return rank 0's
  value" or "return my own value" fails.
* bitwise inputs differ in high bits per rank.

The pytest process computes expectations with the same functions: both sides
agree on inputs by construction, and the expected value is a plain reduction
over the ranks' inputs.
"""

from __future__ import annotations

import torch

from backends.reference.semantics import reduce_tensors  # the oracle: one definition of every op

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")

# Fractional step per dtype that keeps sums exact yet falls off in a narrower type.
_FLOAT_STEP = {"float64": 2.0**-40, "float32": 2.0**-16, "float16": 2.0**-4, "bfloat16": 2.0**-1}

SHAPES = {
    "scalar": (),
    "1d": (7,),
    "2d": (3, 5),
    "empty": (0,),
    "4MiB": (1 << 20,),  # 4 MiB of float32
    "32MiB": (8 << 20,),  # 32 MiB of float32: more than a TCP connection's buffers take (loopback: 4 + 6 MiB at most)
}

# Which reduce ops are meaningful for which dtypes (the contract's matrix).
OPS_BY_KIND = {
    "float": ("sum", "product", "min", "max", "avg"),
    "int": ("sum", "product", "min", "max", "band", "bor", "bxor"),
    "bool": ("min", "max", "band", "bor", "bxor"),
}


def kind_of(dtype: str) -> str:
    return "float" if dtype in FLOAT_DTYPES else "bool" if dtype == "bool" else "int"


def reduce_op(op: str):
    import torch.distributed as dist

    return getattr(dist.ReduceOp, op.upper())


def rank_input(op: str, dtype: str, shape: tuple, rank: int) -> torch.Tensor:
    """The tensor rank ``rank`` contributes (contiguous, on cpu)."""
    numel = 1
    for dim in shape:
        numel *= dim
    i = torch.arange(numel, dtype=torch.int64)
    r = rank
    kind = kind_of(dtype)
    if kind == "bool":
        values = ((i * 3 + r * 5) % 7) < 3 if op != "bxor" else ((i + r) % 3) == 0
    elif kind == "float":
        if op == "product":  # signed powers of two: every product is exact
            exponent = ((i + r) % 3) - 1
            sign = torch.where((i + r) % 4 == 0, -1.0, 1.0)
            values = sign * torch.pow(2.0, exponent.double())
        elif op in ("min", "max"):  # winner moves between ranks across elements
            values = (((i * 3 + r * 5) % 11) - 5).double() + (r + 1) * _FLOAT_STEP[dtype]
        else:  # sum, avg
            values = ((i % 7) + 1).double() + (r + 1) * _FLOAT_STEP[dtype]
    else:
        if op == "product":
            values = ((i + r) % 3) + 1
        elif op in ("min", "max"):
            values = (i * 3 + r * 5) % 11 - (0 if dtype == "uint8" else 5)
        elif op in ("band", "bor", "bxor"):
            values = ((i * 37 + r * 101) ^ (r << (i % 5))) & 0xFF
            if dtype == "int64":
                values = values | ((r + 1) << 40)
            elif dtype == "int32":
                values = values | ((r + 1) << 20)
        else:  # sum
            values = (i % 7) + 1 + r * 3
            if dtype == "int64":
                values = values + 2**55
    return values.to(DTYPES[dtype]).reshape(shape)


def rank_inputs(op: str, dtype: str, shape: tuple, world_size: int) -> list[torch.Tensor]:
    return [rank_input(op, dtype, shape, r) for r in range(world_size)]


def reduced(op: str, dtype: str, shape: tuple, world_size: int) -> torch.Tensor:
    """Closed form of all_reduce / reduce over ranks 0..world_size-1."""
    return reduce_tensors(op, rank_inputs(op, dtype, shape, world_size))


def rank_payload(rank: int, numel: int, dtype: str = "float32", salt: int = 0) -> torch.Tensor:
    """A tensor that says who made it: element k of rank r is r*1000 + k (+ salt)."""
    return (torch.arange(numel, dtype=torch.int64) + rank * 1000 + salt).to(DTYPES[dtype])
