"""Seeded bug in the reference backend: reduce_scatter accumulates in its output, overwriting its own input.

To save a scratch tensor the reduction is accumulated straight in the output:
rank 0's chunk is copied in first, then every other rank's chunk is combined
into it. Out of place that is exact. In place (reduce_scatter_tensor whose
output is this rank's chunk of its input, as FSDP calls it) the chunk this
rank contributes to itself *is* the output, overwritten by rank 0's chunk
before it is read: every rank but 0 gets rank 0's chunk twice and its own
never. Caught by suites/c10d/test_memory_safety.py::test_in_place_on_own_chunk.
"""

from backends.reference import semantics
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class InPlaceReadsOverwritten(ReferenceProcessGroup):
    """reduce_scatter accumulates in its output, reading the rank's own chunk after overwriting it."""

    def reduce_scatter(self, output_tensors, input_lists, opts):
        out, inputs = output_tensors[0], input_lists[0]
        op, factor = self._reduce_op(opts), self._premul_factor(opts)
        if op in ("avg", "premul_sum"):  # not a pairwise fold: left exact, the bug is in the fold
            return super().reduce_scatter(output_tensors, input_lists, opts)
        self._check_count(inputs, "reduce_scatter input list")
        semantics.check_op_dtype(op, out.dtype)
        n = self.size()

        def run(seq, fp, deadline, timeout_s):
            got = self._round(seq, fp, deadline, timeout_s, {p: inputs[p].detach().contiguous() for p in range(n)})
            out.copy_(got[0])  # BUG: in place, got[self.rank()] is this very memory
            for rank in range(1, n):
                out.copy_(semantics.reduce_tensors(op, [out, got[rank]]))
            return [out]

        return self._submit("reduce_scatter", dict(self._describe(out), reduce=op, factor=factor), run, opts)


DISTCONFORM_SPEC = register_reference("reference_in_place_reads_overwritten", InPlaceReadsOverwritten)
