"""Seeded bug: all_reduce runs on a second communicator whose sequence ids are its own.

A backend that keeps a separate communicator for reductions (one per purpose is a common design) and names
it after the group, so torch's flight recorder files its entries under the right group, but every
communicator counts collective_seq_id by itself: results are right and every call is recorded, yet the
group's sequence runs 1, 1, 2 for all_reduce, broadcast, all_gather, so the recorder (and fr_trace after a
hang) pairs the wrong calls across ranks. Caught by the flight-recorder contract
(suites/c10d/test_flight_recorder.py::test_collectives_recorded).
"""

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from tests.seeded.gloo_wrapper import CPU, GlooWrapper, register


class SequencePerCommunicator(GlooWrapper):
    """all_reduce goes through a second gloo communicator named after the group, with its own sequence."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(store, rank, size, timeout)
        reductions_store = dist.PrefixStore("reductions/", store)
        self.reductions = ProcessGroupGloo(reductions_store, rank, size, self.inner_timeout(timeout))
        # a plain ProcessGroup holding it: the way to give a Backend the group's name and description
        self.reductions_pg = dist.ProcessGroup(reductions_store, rank, size)
        self.reductions_pg._register_backend(CPU, dist.ProcessGroup.BackendType.GLOO, self.reductions)

    def _set_group_name(self, name):
        super()._set_group_name(name)
        self.reductions_pg._set_group_name(name)

    def _set_group_desc(self, desc):
        super()._set_group_desc(desc)
        self.reductions_pg._set_group_desc(desc)

    def allreduce(self, tensors, opts=None):
        return self.reductions.allreduce(tensors, dist.AllreduceOptions() if opts is None else opts)


DISTCONFORM_SPEC = register("fr_sequence_per_communicator", SequencePerCommunicator)
