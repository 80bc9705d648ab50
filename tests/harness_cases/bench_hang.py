"""A backend whose all_reduce of 1 KiB or more never completes on rank 0 (for the benchmark's tests).

``--backend-plugin tests.harness_cases.bench_hang --backend bench_hang``: gloo
underneath (tests/seeded/gloo_wrapper.py); small all_reduces and every other
collective work. The collective benchmark must turn the hang into an error
for that collective (through the harness deadline) and go on with the next.
Not part of the seeded-bug gallery: it plants no contract bug, only a hang.
"""

import time

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register

HANG_FROM_ELEMENTS = 256


class BenchHang(GlooWrapper):
    """all_reduce of >= 256 elements waits forever on rank 0."""

    def allreduce(self, tensors, opts):
        work = self.inner.allreduce(tensors, opts)
        if self.rank() == 0 and tensors[0].numel() >= HANG_FROM_ELEMENTS:
            return ThenWork(work, lambda: time.sleep(3600), tensors)
        return work


DISTCONFORM_SPEC = register("bench_hang", BenchHang)
