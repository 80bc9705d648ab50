"""Seeded bug: the coalesced tensor-form reduce_scatter gives each rank its neighbour's chunk.

torch 2.13's functional reduce_scatter (``_c10d_functional.reduce_scatter_tensor``)
calls the group's ``reduce_scatter_single_coalesced``. This backend shifts
the chunks there (rank i gets the reduction of chunk i+1) while
dist.reduce_scatter, dist.reduce_scatter_tensor and FSDP2 are right. Caught
by suites/parallel: test_funcol_reduce_scatter, test_funcol_backward[all_gather]
(its backward is a reduce_scatter), test_funcol_wait_tensor_in_flight,
test_redistribute[partial_to_shard].
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ReduceScatterCoalescedWrongChunk(GlooWrapper):
    """reduce_scatter_single_coalesced hands rank i the reduced chunk i+1."""

    def _shifted(self, inputs):
        n = self.size()
        return [t.reshape(n, -1).roll(-1, dims=0).reshape(t.shape) for t in inputs]  # BUG

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        return super().reduce_scatter_single_coalesced(outputs, self._shifted(inputs), opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        return super().reduce_scatter_tensor_coalesced(outputs, self._shifted(inputs), opts)


DISTCONFORM_SPEC = register("reduce_scatter_coalesced_wrong_chunk", ReduceScatterCoalescedWrongChunk)
