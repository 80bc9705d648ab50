"""Seeded bug: the tensor form of all_gather lays the ranks' pieces out in reverse rank order.

``_allgather_base`` (dist.all_gather_into_tensor / all_gather_single, which
FSDP2 calls to unshard its parameters) places rank i's input at position
n-1-i; the list form ``allgather`` and the coalesced entry point functional
collectives use are right. Caught by suites/parallel: test_fsdp2_matches_baseline
(both reshard modes), test_fsdp2_mixed_precision, test_fsdp2_agrees_with_ddp
(and by suites/c10d's all_gather_into_tensor clause).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register


class AllGatherBaseReversed(GlooWrapper):
    """_allgather_base writes rank i's piece at position n-1-i."""

    def _allgather_base(self, output, input, opts):
        n = self.size()

        def reverse():  # BUG: the pieces' order is flipped once the data is in
            pieces = output.reshape(n, -1)
            pieces.copy_(pieces.flip(0))

        return ThenWork(super()._allgather_base(output, input, opts), reverse, [output])


DISTCONFORM_SPEC = register("allgather_base_reversed", AllGatherBaseReversed)
