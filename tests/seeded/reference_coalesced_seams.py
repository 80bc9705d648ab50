"""Seeded bug in the reference backend: coalesced all_reduce splits its flat buffer at the wrong seams.

The classic way to coalesce: flatten every tensor into one buffer, all_reduce
it once, copy the pieces back. Here the copy-back advances by the first
tensor's size instead of each tensor's own, which is right only when every
tensor has the same size. Caught by suites/c10d/test_coalescing.py (the
coalesced tensors have different sizes on purpose).
"""

import torch
import torch.distributed as dist

from backends.reference.process_group import ReferenceWork
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class CoalescedSeams(ReferenceProcessGroup):
    """all_reduce_coalesced through one flat buffer, copied back at the first tensor's stride."""

    def allreduce_coalesced(self, tensors, opts=None):
        opts = dist.AllreduceCoalescedOptions() if opts is None else opts
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        single = dist.AllreduceOptions()
        single.reduceOp = opts.reduceOp
        self.allreduce([flat], single).wait()
        offset = 0
        for tensor in tensors:
            tensor.view(-1).copy_(flat[offset:offset + tensor.numel()])
            offset += tensors[0].numel()  # BUG: each piece is tensor.numel() long
        done = ReferenceWork("all_reduce_coalesced", self.timeout.total_seconds())
        done.complete(list(tensors))
        return done


DISTCONFORM_SPEC = register_reference("reference_coalesced_seams", CoalescedSeams)
