"""What each collective means: a short function over all ranks' inputs.

This module is the specification the reference process group implements and
the oracle the suites compute expected values with. Each function takes what
every rank passed in (a list indexed by rank) and returns what every rank
must hold afterwards (again a list indexed by rank). Nothing here
communicates; ranks are just list positions.

Reductions combine the ranks' tensors in rank order (rank 0 first),
accumulating in the tensor's own dtype, except float16 and bfloat16, which
accumulate in float32 and are rounded once at the end. Integers wrap around
like any same-width arithmetic. c10d leaves the order of a floating-point
reduction to the backend; the suites therefore use inputs whose every
partial result is exact, so any correct backend matches this oracle bit for
bit.
"""

from __future__ import annotations

from typing import Sequence

import torch

Tensor = torch.Tensor

REDUCE_OPS = ("sum", "product", "min", "max", "avg", "band", "bor", "bxor", "premul_sum")
BITWISE_OPS = ("band", "bor", "bxor")


def op_name(op) -> str:
    """'sum' for 'sum', ReduceOp.SUM or RedOpType.SUM."""
    text = str(op).rsplit(".", 1)[-1].lower()
    if text not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}")
    return text


def check_op_dtype(op: str, dtype: torch.dtype) -> None:
    """The (op, dtype) pairs c10d defines; anything else is a clear error, never garbage."""
    if op in BITWISE_OPS and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"ReduceOp.{op.upper()} needs an integer or bool tensor, got {dtype}")
    if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"ReduceOp.AVG needs a floating-point tensor, got {dtype}")
    if op in ("min", "max") and dtype.is_complex:
        raise ValueError(f"ReduceOp.{op.upper()} is undefined on complex tensors (no ordering), got {dtype}")
    if op == "premul_sum" and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"ReduceOp.PREMUL_SUM needs a floating-point tensor, got {dtype}")


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _combine_into(op: str, acc: Tensor, t: Tensor) -> None:
    """acc = acc (op) t, in place."""
    if op in ("sum", "avg"):
        acc.logical_or_(t) if acc.dtype == torch.bool else acc.add_(t)
    elif op == "product":
        acc.logical_and_(t) if acc.dtype == torch.bool else acc.mul_(t)
    elif op == "min":
        torch.minimum(acc, t.to(acc.dtype), out=acc)
    elif op == "max":
        torch.maximum(acc, t.to(acc.dtype), out=acc)
    elif op == "band":
        acc.bitwise_and_(t)
    elif op == "bor":
        acc.bitwise_or_(t)
    elif op == "bxor":
        acc.bitwise_xor_(t)
    else:
        raise ValueError(f"unknown reduce op {op!r}")


def reduce_tensors(op, tensors: Sequence[Tensor], factor: float | None = None) -> Tensor:
    """``op`` applied elementwise over ``tensors`` (all of one shape and dtype), in rank order.

    PREMUL_SUM multiplies every input by ``factor`` (in the accumulator dtype) before summing,
    as NCCL's ncclRedOpCreatePreMulSum does.
    """
    op = op_name(op)
    dtype = tensors[0].dtype
    check_op_dtype(op, dtype)
    if op == "premul_sum":
        if factor is None:
            raise ValueError("ReduceOp.PREMUL_SUM needs its factor")
        tensors = [t.to(accumulator_dtype(dtype)) * factor for t in tensors]
        op = "sum"
    acc = tensors[0].to(accumulator_dtype(dtype), copy=True)
    for tensor in tensors[1:]:
        _combine_into(op, acc, tensor)
    if op == "avg":
        acc.div_(len(tensors))
    return acc if acc.dtype == dtype else acc.to(dtype)


# ---------------------------------------------------------------- collectives
def all_reduce(inputs: Sequence[Tensor], op) -> list[Tensor]:
    """Every rank gets the reduction of all inputs."""
    result = reduce_tensors(op, inputs)
    return [result.clone() for _ in inputs]


def reduce(inputs: Sequence[Tensor], op, root: int, factor: float | None = None) -> Tensor:
    """The root gets the reduction of all inputs (other ranks' outputs are unspecified)."""
    return reduce_tensors(op, inputs, factor)


def broadcast(inputs: Sequence[Tensor], root: int) -> list[Tensor]:
    """Every rank gets the root's tensor."""
    return [inputs[root].clone() for _ in inputs]


def all_gather(inputs: Sequence[Tensor]) -> list[list[Tensor]]:
    """Every rank gets the list of all inputs, in rank order."""
    return [[t.clone() for t in inputs] for _ in inputs]


def gather(inputs: Sequence[Tensor], root: int) -> list[Tensor]:
    """The root gets the list of all inputs, in rank order."""
    return [t.clone() for t in inputs]


def scatter(root_list: Sequence[Tensor], world_size: int) -> list[Tensor]:
    """Rank i gets entry i of the root's list."""
    if len(root_list) != world_size:
        raise ValueError(f"scatter needs {world_size} tensors at the root, got {len(root_list)}")
    return [t.clone() for t in root_list]


def reduce_scatter(input_lists: Sequence[Sequence[Tensor]], op) -> list[Tensor]:
    """Rank i gets the reduction over ranks of their list entry i."""
    n = len(input_lists)
    return [reduce_tensors(op, [input_lists[r][i] for r in range(n)]) for i in range(n)]


def all_to_all(input_lists: Sequence[Sequence[Tensor]]) -> list[list[Tensor]]:
    """Rank j's output i is rank i's input j."""
    n = len(input_lists)
    return [[input_lists[i][j].clone() for i in range(n)] for j in range(n)]


def split(tensor: Tensor, sizes: Sequence[int] | None, parts: int) -> list[Tensor]:
    """Split along dim 0 into ``sizes`` (or ``parts`` equal pieces), as all_to_all_single does."""
    if sizes is None or len(sizes) == 0:
        if tensor.shape[0] % parts:
            raise ValueError(f"dim 0 of size {tensor.shape[0]} does not split into {parts} equal parts")
        sizes = [tensor.shape[0] // parts] * parts
    if len(sizes) != parts or sum(sizes) != tensor.shape[0]:
        raise ValueError(f"split sizes {list(sizes)} do not cover dim 0 of size {tensor.shape[0]} in {parts} parts")
    return list(torch.split(tensor, list(sizes)))


def all_to_all_single(inputs: Sequence[Tensor], input_splits: Sequence[Sequence[int] | None]) -> list[Tensor]:
    """Rank j's output is, in rank order, the j-th split of every rank's input."""
    n = len(inputs)
    pieces = [split(inputs[r], input_splits[r], n) for r in range(n)]
    return [torch.cat([pieces[i][j] for i in range(n)]) for j in range(n)]


def all_reduce_coalesced(input_lists: Sequence[Sequence[Tensor]], op) -> list[list[Tensor]]:
    """Tensor i of every rank becomes the reduction over ranks of their tensor i."""
    n = len(input_lists)
    reduced = [reduce_tensors(op, [input_lists[r][i] for r in range(n)]) for i in range(len(input_lists[0]))]
    return [[t.clone() for t in reduced] for _ in range(n)]


def all_gather_coalesced(input_lists: Sequence[Sequence[Tensor]]) -> list[list[list[Tensor]]]:
    """Every rank gets, for every rank r, rank r's list of inputs (output_lists[r][i])."""
    return [[[t.clone() for t in inputs] for inputs in input_lists] for _ in input_lists]


def all_gather_into_tensor(inputs: Sequence[Tensor]) -> list[Tensor]:
    """Every rank gets all inputs concatenated along dim 0, in rank order."""
    return [torch.cat(list(inputs)) for _ in inputs]


def reduce_scatter_tensor(inputs: Sequence[Tensor], op) -> list[Tensor]:
    """Rank i gets the reduction over ranks of dim-0 chunk i of their input."""
    n = len(inputs)
    return reduce_scatter([list(t.chunk(n)) for t in inputs], op)


def sparse_all_reduce(inputs: Sequence[Tensor], op="sum") -> list[Tensor]:
    """Sparse COO tensors summed over ranks (indices merged, values of equal indices added), coalesced.

    SUM is the only reduction of sparse tensors c10d defines (gloo's is the model)."""
    if op_name(op) != "sum":
        raise ValueError(f"sparse all_reduce supports ReduceOp.SUM only, got ReduceOp.{op_name(op).upper()}")
    total = inputs[0].coalesce()
    for tensor in inputs[1:]:
        total = total + tensor.coalesce()
    total = total.coalesce()
    return [total.clone() for _ in inputs]
