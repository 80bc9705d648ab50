"""Seeded bug: uint8 data moved by broadcast, all_gather, gather and scatter saturates at 127.

A backend that stages byte tensors through a signed char buffer with a
saturating cast: every byte from 0x80 up arrives as 0x7f. The tensor clauses
of all_gather, gather and scatter move uint8 values below 128 and miss it
(broadcast's uint8 case and the differential suite do catch it); object
collectives cannot survive it, since every pickle starts with the PROTO
opcode 0x80. Caught by the object-collective contract on its own
(suites/c10d/test_objects.py), which needs the objects to come back equal.
"""

import torch

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register


def _saturate(tensors) -> None:
    for tensor in tensors:
        if tensor.dtype == torch.uint8:
            tensor.clamp_(max=127)  # BUG: a signed staging buffer with a saturating cast


class Uint8SaturatesAt127(GlooWrapper):
    """byte tensors that a data-moving collective wrote are clamped to 127."""

    def broadcast(self, tensors, opts):
        return ThenWork(super().broadcast(tensors, opts), lambda: _saturate(tensors))

    def allgather(self, output_lists, input_tensors, opts):
        work = super().allgather(output_lists, input_tensors, opts)
        return ThenWork(work, lambda: _saturate([t for out in output_lists for t in out]))

    def gather(self, output_lists, input_tensors, opts):
        work = super().gather(output_lists, input_tensors, opts)
        return ThenWork(work, lambda: _saturate([t for out in output_lists for t in out]))

    def scatter(self, output_tensors, input_lists, opts):
        return ThenWork(super().scatter(output_tensors, input_lists, opts), lambda: _saturate(output_tensors))


DISTCONFORM_SPEC = register("uint8_saturates_at_127", Uint8SaturatesAt127)
