"""Seeded bug: async all_reduce reports completion before the result has landed.

The Work returned for ``async_op=True`` is already complete: ``wait()``
returns at once, and the reduced values are written into the caller's tensor
only later, from a background thread (as a backend that completes the Work
when the request is *queued* rather than when the data is copied out would).
The synchronous path is correct. Caught by the async all_reduce contract
(suites/c10d/test_all_reduce.py::test_all_reduce_async): after wait() the
tensor still holds the rank's own input.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, late_write, register

LATE_BY_S = 0.5


class AsyncEarlyCompletion(GlooWrapper):
    """Async all_reduce returns a completed Work; the data arrives 0.5 s later."""

    def allreduce(self, tensors, opts):
        if not opts.asyncOp:
            return super().allreduce(tensors, opts)
        scratch = [t.clone() for t in tensors]
        self.inner.allreduce(scratch, opts).wait()
        late_write(list(zip(scratch, tensors)), delay=LATE_BY_S)
        return completed_work(tensors)


DISTCONFORM_SPEC = register("async_early_completion", AsyncEarlyCompletion)
