"""Seeded bug: reduce_scatter (tensor form) gives each rank its neighbour's chunk.

An off-by-one in the chunk offset: rank i receives the reduction of chunk
i+1 (mod world size). Every value is a correct reduction, just of the wrong
chunk. Caught by the reduce_scatter contract
(suites/c10d/test_reduce_scatter.py::test_reduce_scatter_tensor).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ReduceScatterWrongChunk(GlooWrapper):
    """reduce_scatter_tensor hands rank i the reduced chunk i+1."""

    def _reduce_scatter_base(self, output, input, opts):
        chunks = input.reshape(self.size(), -1)
        shifted = chunks.roll(-1, dims=0).reshape(input.shape)  # chunk i+1 now sits at i
        return super()._reduce_scatter_base(output, shifted, opts)


DISTCONFORM_SPEC = register("reduce_scatter_wrong_chunk", ReduceScatterWrongChunk)
