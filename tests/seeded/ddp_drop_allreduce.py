"""Seeded bug: every 7th all_reduce silently does nothing.

A backend that loses one all_reduce in seven (a dropped message with no
error path, a completion flagged before the data moved) but reports success:
the Work is complete and the tensor holds this rank's own input. In DDP that
is one bucket left un-averaged now and then: each rank keeps its local
(pre-divided) gradient, the replicas drift apart, nothing raises. Caught by
the DDP contract (suites/ddp/): gradients no longer equal the single-process
baseline on the concatenated batch.

The counter is per process group and counts every all_reduce (Join's and
DDP's included); all ranks issue the same sequence, so all drop the same
call and nobody hangs: the failure is silent, as in the field.
"""

import itertools

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register

DROP_EVERY = 7


class DropEverySeventhAllReduce(GlooWrapper):
    """all_reduce returns a completed Work without communicating on every 7th call."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(store, rank, size, timeout)
        self._calls = itertools.count(1)

    def allreduce(self, tensors, opts=None):
        if next(self._calls) % DROP_EVERY == 0:
            return completed_work(tensors)  # "done", data untouched
        return super().allreduce(tensors, opts)


DISTCONFORM_SPEC = register("ddp_drop_allreduce", DropEverySeventhAllReduce)
