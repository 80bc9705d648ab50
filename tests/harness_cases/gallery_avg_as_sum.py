"""A seeded bug for tests/test_gallery.py that the all_reduce clause's own check catches: AVG summed."""

import torch.distributed as dist

from tests.seeded.gloo_wrapper import GlooWrapper, register


class AvgAsSum(GlooWrapper):
    """all_reduce with ReduceOp.AVG sums and never divides by the world size."""

    def allreduce(self, tensors, opts):
        if opts.reduceOp == dist.ReduceOp.AVG:
            opts.reduceOp = dist.ReduceOp.SUM
        return super().allreduce(tensors, opts)


DISTCONFORM_SPEC = register("gallery_avg_as_sum", AvgAsSum)
