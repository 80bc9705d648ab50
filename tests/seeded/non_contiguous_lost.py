"""Seeded bug: all_gather into non-contiguous output tensors loses the result.

The backend needs contiguous buffers, so it gathers into ``t.contiguous()``
copies of the caller's outputs, and forgets to copy them back: a strided
output view keeps its old contents (``.contiguous()`` of an already
contiguous tensor is the tensor itself, so the common case works). gloo
itself gets this right for all_gather outputs (probed on torch 2.13; it does
not for all_reduce, broadcast, reduce, scatter or reduce_scatter, whose
non-contiguous results it also loses). Caught by an all_gather clause whose
output list holds strided views.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class NonContiguousLost(GlooWrapper):
    """all_gather writes into contiguous temporaries and never copies them back."""

    def allgather(self, output_lists, input_tensors, opts):
        staged = [[t.contiguous() for t in outputs] for outputs in output_lists]
        return super().allgather(staged, input_tensors, opts)  # BUG: no copy back


DISTCONFORM_SPEC = register("non_contiguous_lost", NonContiguousLost)
