"""Seeded bug: the tensor form of reduce_scatter computes AVG as SUM.

``_reduce_scatter_base`` (reduce_scatter_tensor / reduce_scatter_single)
forgets to divide by the group size for ReduceOp.AVG; the list form is right.
FSDP2 reduce-scatters float32 gradients with AVG, so every step applies
world_size times the gradient. Caught by suites/parallel: test_fsdp2_matches_baseline,
test_fsdp2_mixed_precision, test_fsdp2_agrees_with_ddp and
test_funcol_reduce_scatter[avg].
"""

import torch.distributed as dist

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ReduceScatterBaseAvgAsSum(GlooWrapper):
    """_reduce_scatter_base with ReduceOp.AVG sums and never divides."""

    def _reduce_scatter_base(self, output, input, opts):
        if opts.reduceOp == dist.ReduceOp.AVG:
            opts.reduceOp = dist.ReduceOp.SUM  # BUG
        return super()._reduce_scatter_base(output, input, opts)


DISTCONFORM_SPEC = register("reduce_scatter_base_avg_as_sum", ReduceScatterBaseAvgAsSum)
