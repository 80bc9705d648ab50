"""Seeded bug in the reference backend: every collective writes one element past its output.

The copy of a result into the caller's tensor runs one element too far (``<=``
for ``<``): after each collective the element just past every output tensor
gets the output's last value again. In a tightly sized tensor the extra element
has nowhere to go (a C backend would corrupt the heap silently; here nothing
is written), so the clauses on tightly sized tensors pass; the guard region
after an output placed inside a larger buffer is what shows it. Caught by
suites/c10d/test_memory_safety.py::test_guard_regions.
"""

import torch

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


def _one_past(tensor: torch.Tensor, written: list) -> None:
    """Write the tensor's last element once more, just past its end, where its storage has room.

    Not where that element belongs to another output of the same call (the next chunk of
    all_gather_into_tensor's output): the bug shows past the output, never inside it.
    """
    if not tensor.is_contiguous() or tensor.numel() == 0:
        return
    end = tensor.storage_offset() + tensor.numel()
    if end >= tensor.untyped_storage().nbytes() // tensor.element_size():
        return  # no room: a C backend would write into the heap here
    if any(_covers(other, tensor, end) for other in written):
        return
    past = tensor.as_strided((1,), (1,), end)
    past.copy_(tensor.reshape(-1)[-1:])


def _covers(other: torch.Tensor, tensor: torch.Tensor, offset: int) -> bool:
    """Whether ``other`` (contiguous) holds element ``offset`` of ``tensor``'s storage."""
    same = other.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    return same and other.storage_offset() <= offset < other.storage_offset() + other.numel()


class WritesPastOutput(ReferenceProcessGroup):
    """The copy of every collective's result into its output tensors writes one element too many."""

    def _submit(self, name, fingerprint, run, *args, **kwargs):
        def overrunning(seq, fp, deadline, timeout_s):
            written = run(seq, fp, deadline, timeout_s)
            for tensor in written or ():
                _one_past(tensor, written)  # BUG
            return written

        return super()._submit(name, fingerprint, overrunning, *args, **kwargs)


DISTCONFORM_SPEC = register_reference("reference_writes_past_output", WritesPastOutput)
