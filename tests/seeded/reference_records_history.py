"""Seeded bug in the reference backend: the worker thread writes results with autograd recording.

Every collective's job runs with grad mode on in the worker thread (as the
reference did before the fix): the copy_ of a result into the caller's tensor
is recorded whenever that tensor already has autograd history, even when the
caller disabled grad (grad mode is per thread): the tensor is rebased onto a
CopyBackwards node and the gradient through its earlier history is zero (what
made funcol all_reduce backwards intermittently sum zeros for one rank).
Caught by suites/c10d/test_all_reduce.py::test_all_reduce_leaves_autograd_history_alone.
"""

import torch

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class RecordsHistory(ReferenceProcessGroup):
    """Collectives' results are written with autograd recording on (in the worker thread)."""

    def _submit(self, name, fingerprint, run, *args, **kwargs):
        def recorded(*run_args):
            with torch.enable_grad():  # BUG: the worker records the copy_ into the caller's tensor
                return run(*run_args)
        return super()._submit(name, fingerprint, recorded, *args, **kwargs)


DISTCONFORM_SPEC = register_reference("reference_records_history", RecordsHistory)
