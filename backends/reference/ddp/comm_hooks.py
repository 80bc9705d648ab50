"""Communication hooks: how a ready bucket is turned into its reduced gradients.

A hook is ``hook(state, bucket) -> Future[Tensor]``: it gets a ``GradBucket``
(the bucket's flat buffer and its parameters) and returns a future of one
tensor shaped like ``bucket.buffer()``, the reduced gradients. Without a hook
the reducer divides every gradient by the divide factor while copying it into
the buffer and all-reduces with SUM (``allreduce_by_sum``); with a hook it
copies gradients undivided and the hook owns the averaging.

The hooks below carry no annotations: torch's DDP checks a hook's annotations
against ``dist.GradBucket``, and these hooks serve both DDPs.

``GradBucket`` has the methods of ``torch.distributed.GradBucket`` that hooks
use, so torch's own hooks
(``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``) run unchanged
on the reference reducer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class GradBucket:
    """What a comm hook sees of one bucket (duck-types ``torch.distributed.GradBucket``)."""

    def __init__(self, index: int, bucket_count: int, buffer: torch.Tensor, offsets, lengths, parameters):
        self._index, self._bucket_count = index, bucket_count
        self._buffer = buffer
        self._offsets, self._lengths = list(offsets), list(lengths)
        self._parameters = list(parameters)

    def index(self) -> int:
        """The bucket's position in reducer order (0 = reduced first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat buffer holding every gradient of the bucket."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def gradients(self) -> list[torch.Tensor]:
        """One view of the buffer per parameter, shaped like the parameter."""
        return [self._buffer.narrow(0, offset, length).view(p.shape)
                for offset, length, p in zip(self._offsets, self._lengths, self._parameters)]

    def parameters(self) -> list[torch.Tensor]:
        return list(self._parameters)

    def is_last(self) -> bool:
        """Whether this is the last bucket of the iteration (the one holding the first parameters)."""
        return self._index == self._bucket_count - 1

    def __repr__(self) -> str:
        return f"GradBucket(index={self._index}, numel={self._buffer.numel()}, parameters={len(self._parameters)})"


def allreduce_by_sum(process_group, bucket):
    """The reducer's built-in reduction when no hook is registered: SUM, no division.

    Gradients were already divided on their way into the buffer.
    """
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def allreduce_hook(process_group, bucket):
    """Average: divide the buffer by the group size, then SUM all-reduce (equals no hook up to rounding)."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))
    work = dist.all_reduce(buffer, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def fp16_compress_hook(process_group, bucket):
    """Average in float16: half the bytes on the wire, about 1e-3 relative error."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16).div_(dist.get_world_size(group))
    work = dist.all_reduce(compressed, group=group, async_op=True)

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return work.get_future().then(decompress)
