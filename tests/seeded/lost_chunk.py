"""Seeded bug: a large all_reduce is split into chunks and the last chunk is never reduced.

An off-by-one in a pipelined (chunked) all_reduce loop: ``range(0, n - CHUNK,
CHUNK)`` stops one chunk early, so the tail of a big tensor keeps the rank's
own input. Small tensors take the unchunked path and are right. Caught by the
all_reduce shape contract (suites/c10d/test_all_reduce.py::test_all_reduce_shapes,
the 4MiB case) and the async one (test_all_reduce_async, float32 4MiB).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register

CHUNK = 1 << 16  # elements per pipelined step


class LostChunk(GlooWrapper):
    """Chunked all_reduce whose loop stops one chunk early."""

    def allreduce(self, tensors, opts):
        tensor = tensors[0]
        if len(tensors) != 1 or tensor.numel() <= CHUNK or not tensor.is_contiguous():
            return super().allreduce(tensors, opts)
        flat = tensor.view(-1)
        for start in range(0, flat.numel() - CHUNK, CHUNK):  # BUG: drops the last chunk
            self.inner.allreduce([flat[start:start + CHUNK]], opts).wait()
        return completed_work(tensors)


DISTCONFORM_SPEC = register("lost_chunk", LostChunk)
