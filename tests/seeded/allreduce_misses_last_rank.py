"""Seeded bug: all_reduce SUM leaves out the last rank's contribution.

An off-by-one in a hand-written reduction loop (``range(world_size - 1)``):
exact for the other ops, wrong for SUM whenever the last rank contributes
something. Caught by suites/parallel: test_redistribute[partial_to_replicate]
(DTensor turns a Partial into a Replicate with one all_reduce),
test_sharded_matmul[1d-rowwise], test_device_mesh_dims, test_funcol_all_reduce
and test_funcol_group_forms (and by suites/c10d's all_reduce matrix).
"""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register


class AllReduceMissesLastRank(GlooWrapper):
    """all_reduce SUM adds up ranks 0 .. n-2 only."""

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None or opts.reduceOp != dist.ReduceOp.SUM or len(tensors) != 1:
            return super().allreduce(tensors, opts)
        tensor = tensors[0]
        pieces = [torch.empty_like(tensor) for _ in range(self.size())]
        self.inner.allgather([pieces], [tensor.contiguous()], AllgatherOptions()).wait()
        total = pieces[0].clone()
        for piece in pieces[1:-1]:  # BUG: the last rank's piece is never added
            total.add_(piece)
        tensor.copy_(total)
        return completed_work(tensors)


DISTCONFORM_SPEC = register("allreduce_misses_last_rank", AllReduceMissesLastRank)
