"""Seeded bug: the tensor-form collectives report completion before their data has landed.

``all_gather_single_coalesced`` and ``reduce_scatter_single_coalesced`` (what
torch 2.13's functional collectives and DTensor call) return a Work that is already complete;
the data is copied into the output 0.3 s later from a background thread,
as a backend that completes the Work when the request is queued would.
dist.all_gather_into_tensor, dist.reduce_scatter_tensor and the list forms are right. Caught by suites/parallel:
test_funcol_wait_tensor_in_flight (wait_tensor returns before the result
exists), test_funcol_all_gather and test_funcol_reduce_scatter.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, late_write, register

LATE_BY_S = 0.3


class FuncolWaitEarly(GlooWrapper):
    """Tensor-form all_gather/reduce_scatter: completed Work at once, data 0.3 s later."""

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        scratch = [out.clone() for out in outputs]
        self.inner_pg.all_gather_single_coalesced(scratch, inputs, opts).wait()
        late_write(list(zip(scratch, outputs)), delay=LATE_BY_S)  # BUG: completes before the copy
        return completed_work(outputs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        scratch = [out.clone() for out in outputs]
        self.inner_pg.reduce_scatter_single_coalesced(scratch, inputs, opts).wait()
        late_write(list(zip(scratch, outputs)), delay=LATE_BY_S)  # BUG: completes before the copy
        return completed_work(outputs)


DISTCONFORM_SPEC = register("funcol_wait_early", FuncolWaitEarly)
