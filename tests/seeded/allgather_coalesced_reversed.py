"""Seeded bug: the coalesced tensor-form all_gather lays the ranks' pieces out in reverse rank order.

torch 2.13's functional all_gather (``_c10d_functional.all_gather_into_tensor``,
what DTensor and every funcol user reach) calls the group's
``all_gather_single_coalesced`` with one tensor, not ``_allgather_base``. This
backend gets that entry point wrong (rank i's piece at position n-1-i) while
dist.all_gather, dist.all_gather_into_tensor and FSDP2 are right. Caught by
suites/parallel: test_funcol_all_gather, test_funcol_backward[reduce_scatter]
(its backward is an all_gather), test_funcol_wait_tensor_in_flight,
test_redistribute (Shard -> Replicate, Shard(0) -> Shard(1), uneven, on every
mesh dimension), test_sharded_matmul (column-wise, 2-D row-wise).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register


def _reversed_after(work, outputs, n):
    def reverse():  # BUG: each output's pieces are flipped once the data is in
        for out in outputs:
            pieces = out.reshape(n, -1)
            pieces.copy_(pieces.flip(0))
    return ThenWork(work, reverse, outputs)


class AllGatherCoalescedReversed(GlooWrapper):
    """all_gather_single_coalesced writes rank i's piece at position n-1-i."""

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        return _reversed_after(super().all_gather_single_coalesced(outputs, inputs, opts), outputs, self.size())

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        return _reversed_after(super().allgather_into_tensor_coalesced(outputs, inputs, opts), outputs, self.size())


DISTCONFORM_SPEC = register("allgather_coalesced_reversed", AllGatherCoalescedReversed)
