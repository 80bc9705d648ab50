"""Seeded bug in the reference backend: all_reduce_coalesced is not implemented.

The group does not override ``allreduce_coalesced``, so ``dist.all_reduce_coalesced``
(and ``_coalescing_manager`` around all_reduce calls, which uses it) falls through
to c10d's C++ ProcessGroup base and fails with "No backend type associated with
device type cpu": the hole the reference itself had before the entry-point
contract existed. Caught by suites/c10d/test_entry_points.py::test_entry_point
[...-all_reduce_coalesced], whose failure names dist.all_reduce_coalesced.
"""

import torch.distributed as dist

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class CoalescedHole(ReferenceProcessGroup):
    """allreduce_coalesced is c10d's C++ base method again (no backend behind it)."""

    allreduce_coalesced = dist.ProcessGroup.allreduce_coalesced  # BUG


DISTCONFORM_SPEC = register_reference("reference_coalesced_hole", CoalescedHole)
