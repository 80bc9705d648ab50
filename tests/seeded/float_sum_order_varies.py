"""Seeded bug: floating-point SUM/AVG adds the ranks' contributions in a varying order.

A backend that reduces in whatever order contributions arrive (a thread
pool, a tree shaped by timing). Every result is a correct sum of the right
values, so the closed-form clauses, whose inputs sum exactly in any order,
pass; with ordinary floats the bits change from call to call and from rank
to rank. Simulated with an all_gather and a sum in a random order per call
and per rank, for all_reduce and the tensor form of reduce_scatter (which
FSDP2 uses). Three ranks at least: two floats add up the same either way.
Caught by suites/parallel/test_determinism.py: test_all_reduce_bitwise_repeatable,
test_all_reduce_bitwise_fresh_world, test_fsdp2_step_bitwise_repeatable.
"""

import random

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register

ORDERED_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)
# from the OS, not the random module: ranks forked from one server share its random state
ARRIVAL = random.SystemRandom()


def _ordered(op) -> bool:
    # `op in ORDERED_OPS` is False for an equal ReduceOp (torch 2.13): compare with ==
    return any(op == other for other in ORDERED_OPS)


class FloatSumOrderVaries(GlooWrapper):
    """Float SUM/AVG reductions add ranks in a random order (per call, per rank)."""

    def _gather(self, tensor):
        pieces = [torch.empty_like(tensor) for _ in range(self.size())]
        self.inner.allgather([pieces], [tensor.contiguous()], AllgatherOptions()).wait()
        return pieces

    def _sum(self, pieces, op):
        order = ARRIVAL.sample(range(len(pieces)), len(pieces))  # BUG: arrival order
        total = pieces[order[0]].clone()
        for i in order[1:]:
            total.add_(pieces[i])
        return total.div_(len(pieces)) if op == dist.ReduceOp.AVG else total

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None or not _ordered(opts.reduceOp) or len(tensors) != 1 \
                or not tensors[0].is_floating_point():
            return super().allreduce(tensors, opts)
        tensors[0].copy_(self._sum(self._gather(tensors[0]), opts.reduceOp))
        return completed_work(tensors)

    def _reduce_scatter_base(self, output, input, opts):
        if not _ordered(opts.reduceOp) or not input.is_floating_point():
            return super()._reduce_scatter_base(output, input, opts)
        mine = [piece.reshape(self.size(), -1)[self.rank()] for piece in self._gather(input)]
        output.copy_(self._sum(mine, opts.reduceOp).reshape(output.shape))
        return completed_work([output])


DISTCONFORM_SPEC = register("float_sum_order_varies", FloatSumOrderVaries)
