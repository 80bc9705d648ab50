"""Seeded bug: once an all_reduce of a group timed out, the group's next all_reduce never completes.

The backend remembers that a collective of the group failed and hands every
later all_reduce a Work that is never completed, instead of failing it at
once (gloo's declared behaviour, which the wrapper inherits: 'Application
timeout caused pair closure'). The ranks that timed out block in their next
all_reduce; caught by the clause on the group after a timeout
(suites/c10d/test_timeouts.py::test_group_after_a_timeout_behaves_as_declared),
through the harness deadline, which kills the hung world and fails the case
with every rank's stack and collective.
"""

import torch
from torch._C._distributed_c10d import _create_work_from_future

from tests.seeded.gloo_wrapper import GlooWrapper, register


class GroupHangsAfterTimeout(GlooWrapper):
    """gloo whose all_reduce, after one of the group's all_reduces failed, returns a Work that never completes."""

    failed = False

    def allreduce(self, tensors, opts=None):
        if self.failed:
            return _create_work_from_future(torch.futures.Future())  # never completed
        work = super().allreduce(tensors, opts)
        work.get_future().add_done_callback(self._note_failure)
        return work

    def _note_failure(self, future) -> None:
        try:
            future.wait()
        except Exception:  # the collective failed (here: timed out)
            self.failed = True


DISTCONFORM_SPEC = register("group_hangs_after_timeout", GroupHangsAfterTimeout)

