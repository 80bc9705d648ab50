"""Gradient buckets: which parameters are reduced together, and the flat buffer they share.

Reducing every gradient separately costs one collective per parameter;
reducing all of them at the end loses the overlap with backward. DDP groups
gradients into buckets of roughly ``bucket_cap_mb`` and all-reduces a bucket
as soon as all its gradients are ready, in a fixed bucket order every rank
agrees on.

Assignment (``dist._compute_bucket_assignment_by_size``, reproduced exactly):
walk the tensors in order, accumulating per (dtype, device); when a bucket's
size reaches its current limit (``>=``, so a bucket may exceed its cap by one
tensor) close it and advance that key's limit to the next one in the list
(the last limit repeats); flush what is left per key; at construction sort
the buckets by their lowest index. DDP then hands the *reversed* list to the
reducer: parameters defined last produce their gradients first in backward,
so reducer bucket 0 holds the last-defined parameters.

Rebuild (once): after the first synced backward the reducer knows the order
in which gradients became ready, assigns buckets again in that order with
limits [first bucket cap, bucket cap] (no sorting: the order already is the
ready order), and takes rank 0's layout on every rank (two broadcasts).
"""

from __future__ import annotations

import dataclasses
import sys

import torch
import torch.distributed as dist

DEFAULT_BUCKET_CAP_MB = 25
MB = 1024 * 1024
DEFAULT_FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES  # 1 MiB in torch 2.13


@dataclasses.dataclass(frozen=True)
class BucketCaps:
    """Bucket size limits in bytes, from the ``bucket_cap_mb`` argument."""

    bucket_bytes_cap: int
    first_bucket_bytes_cap: int  # the small first bucket starts communication early

    @classmethod
    def from_argument(cls, bucket_cap_mb) -> BucketCaps:
        cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MB)
        # the 1 MiB first bucket only with the default cap; an explicit cap is used for all buckets
        first = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
        return cls(cap, first)

    def initial_limits(self, static_graph: bool, find_unused_parameters: bool) -> list[int]:
        """Limits for the construction-time assignment.

        Without unused-parameter search (or with a static graph) buckets are
        rebuilt after the first iteration anyway, so construction puts
        everything in one bucket per (dtype, device).
        """
        if static_graph or not find_unused_parameters:
            return [sys.maxsize]
        if self.first_bucket_bytes_cap < self.bucket_bytes_cap:
            return [self.first_bucket_bytes_cap, self.bucket_bytes_cap]
        return [self.bucket_bytes_cap]

    def rebuild_limits(self) -> list[int]:
        return [self.first_bucket_bytes_cap, self.bucket_bytes_cap]


def compute_bucket_assignment_by_size(tensors, bucket_size_limits, expect_sparse_gradient=None,
                                      tensor_indices=None) -> tuple[list[list[int]], list[int]]:
    """(bucket indices, per-bucket size limit): the same values as ``dist._compute_bucket_assignment_by_size``.

    ``tensor_indices`` (rebuild) gives each tensor's parameter index; then the
    tensors are in gradient-ready order and the buckets are not sorted.
    """
    if not tensors:
        raise ValueError("bucket assignment needs at least one tensor")
    if expect_sparse_gradient and len(expect_sparse_gradient) not in (len(tensors), 0):
        raise ValueError(f"expect_sparse_gradient has {len(expect_sparse_gradient)} entries for {len(tensors)} tensors")
    result: list[tuple[list[int], int]] = []
    open_buckets: dict[tuple, dict] = {}  # (dtype, device) -> {"indices", "size", "limit"}; insertion-ordered
    limit_position: dict[tuple, int] = {}
    for i, tensor in enumerate(tensors):
        if tensor.is_sparse:
            raise RuntimeError("No support for sparse tensors.")
        index = i if tensor_indices is None else int(tensor_indices[i])
        if expect_sparse_gradient and expect_sparse_gradient[index]:
            result.append(([index], 0))  # a sparse gradient is a bucket of its own, without limit
            continue
        key = (tensor.dtype, tensor.device)
        bucket = open_buckets.setdefault(key, {"indices": [], "size": 0, "limit": 0})
        bucket["indices"].append(index)
        bucket["size"] += tensor.numel() * tensor.element_size()
        position = limit_position.setdefault(key, 0)
        bucket["limit"] = bucket_size_limits[position]
        if bucket["size"] >= bucket["limit"]:
            result.append((bucket["indices"], bucket["limit"]))
            open_buckets[key] = {"indices": [], "size": 0, "limit": 0}
            limit_position[key] = min(position + 1, len(bucket_size_limits) - 1)
    for bucket in open_buckets.values():
        if bucket["indices"]:
            result.append((bucket["indices"], bucket["limit"]))
    if tensor_indices is None:
        result.sort(key=lambda entry: min(entry[0]))
    return [indices for indices, _ in result], [limit for _, limit in result]


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Its elements fill a contiguous block of memory, in some dimension order (C++ ``is_non_overlapping_and_dense``)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda dim: dim[1]):
        if size == 1:
            continue  # a size-1 dimension's stride does not matter
        if stride != expected:
            return False
        expected *= size
    return True


def view_in(flat: torch.Tensor, param: torch.Tensor, offset: int) -> torch.Tensor:
    """The part of ``flat`` that holds ``param``'s gradient.

    A dense parameter gets a view with the parameter's own strides, because
    AccumulateGrad creates gradients with the parameter's layout (the gradient
    layout contract); otherwise a C-contiguous view.
    """
    if non_overlapping_and_dense(param):
        return flat.as_strided(param.shape, param.stride(), flat.storage_offset() + offset)
    return flat.narrow(0, offset, param.numel()).view(param.shape)


@dataclasses.dataclass
class Bucket:
    """One reducer bucket: its parameters, their gradients' flat buffer and views into it."""

    index: int
    variable_indices: list[int]  # managed-parameter indices, in bucket order
    variables: list[torch.Tensor]
    buffer: torch.Tensor  # flat; every gradient of the bucket lives in it during reduction
    offsets: list[int]
    lengths: list[int]
    views_in: list[torch.Tensor]  # where gradients are copied (or live, gradient_as_bucket_view)
    views_out: list[torch.Tensor]  # where the reduced result is read (the comm hook's tensor)
    size_limit: int = 0
    pending: int = 0  # gradients not yet ready in this backward
    future: torch.futures.Future | None = None

    @classmethod
    def build(cls, index: int, variable_indices: list[int], params: list[torch.Tensor], size_limit: int = 0) -> Bucket:
        variables = [params[i] for i in variable_indices]
        first = variables[0]
        for v in variables[1:]:
            if v.dtype != first.dtype or v.device != first.device:
                raise RuntimeError(
                    f"All parameters in a bucket must have the same dtype and device; bucket {index} mixes "
                    f"{first.dtype}/{first.device} with {v.dtype}/{v.device}.")
        lengths = [v.numel() for v in variables]
        offsets = [sum(lengths[:k]) for k in range(len(lengths))]
        buffer = torch.zeros(sum(lengths), dtype=first.dtype, device=first.device)
        views = [view_in(buffer, v, off) for v, off in zip(variables, offsets)]
        return cls(index, list(variable_indices), variables, buffer, offsets, lengths, views, list(views),
                   size_limit, len(variables))

    def point_views_out_at(self, result: torch.Tensor) -> None:
        """Read the reduced gradients from ``result`` (a comm hook may return a new tensor)."""
        if result.numel() != self.buffer.numel():
            raise RuntimeError(
                f"DDP comm hook returned a tensor of {result.numel()} elements for bucket {self.index}, "
                f"whose buffer has {self.buffer.numel()}; a hook must return a tensor shaped like bucket.buffer().")
        result = result.view(-1)
        self.views_out = [view_in(result, v, off) for v, off in zip(self.variables, self.offsets)]


def sync_bucket_indices(bucket_indices: list[list[int]], process_group, device) -> list[list[int]]:
    """Rank 0's bucket layout on every rank (Reducer::sync_bucket_indices).

    First broadcast: all indices flattened plus the number of buckets (its
    length, one per parameter + 1, is the same on every rank); second: the
    size of each bucket (sized by rank 0's bucket count, now known).
    """
    from .params import global_rank

    flat = [i for bucket in bucket_indices for i in bucket] + [len(bucket_indices)]
    indices = torch.tensor(flat, dtype=torch.int32).to(device)
    dist.broadcast(indices, src=global_rank(process_group, 0), group=process_group)
    indices = indices.cpu()
    num_buckets = int(indices[-1])
    local_sizes = [len(b) for b in bucket_indices]
    sizes = torch.tensor([local_sizes[min(i, len(local_sizes) - 1)] for i in range(num_buckets)],
                         dtype=torch.int32).to(device)
    dist.broadcast(sizes, src=global_rank(process_group, 0), group=process_group)
    result, position = [], 0
    for size in sizes.cpu().tolist():
        result.append(indices[position:position + size].tolist())
        position += size
    return result
