"""Seeded bug: all_reduce AVG on a subgroup divides by the world size, not the group size.

The backend computes AVG as SUM followed by a division by the *default
group's* size. Every clause whose group is the whole world passes; on a 2-D
DeviceMesh each mesh dimension is a smaller group, and its averages come out
too small. Caught by suites/parallel: test_device_mesh_dims[2d] (world size 4).
"""

import torch
import torch.distributed as dist

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register


class SubgroupAvgByWorldSize(GlooWrapper):
    """all_reduce AVG = SUM / dist.get_world_size(), whatever the group."""

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None or opts.reduceOp != dist.ReduceOp.AVG:
            return super().allreduce(tensors, opts)
        opts.reduceOp = dist.ReduceOp.SUM
        divisor = dist.get_world_size()  # BUG: the world's size, not self.size()

        def divide():
            for t in tensors:
                t.div_(divisor)

        return ThenWork(super().allreduce(tensors, opts), divide, tensors)


DISTCONFORM_SPEC = register("subgroup_avg_by_world_size", SubgroupAvgByWorldSize)
