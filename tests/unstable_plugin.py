"""A backend plugin whose verdicts vary between runs, deterministically: the Stability section's proof.

gloo behind tests/seeded/gloo_wrapper.py's ``GlooWrapper`` with three planted behaviours, each counted per
rank process (every rank calls in the same order, so every rank deviates on the same call, and a persistent
world carries the count from one repeat of a case to the next):

* ``all_gather`` into a list rotates its entries on every ``LIST_EVERY``-th call: held to the contract, so
  ``test_all_gather_list`` fails in some repeats only (the backend is flaky);
* ``all_gather_into_tensor`` zeroes its output on every ``TENSOR_EVERY``-th call, under a declared strict
  gap for int64: that gap shows in some repeats only (it is intermittent, not what the spec says);
* ``gather`` works, under a declared *intermittent* gap for float32 that therefore never shows.

    pytest suites/c10d/test_gather_scatter.py --backend-plugin tests.unstable_plugin --backend unstable --repeat 6
"""

from __future__ import annotations

import dataclasses
import itertools

from backends.spec import Gap
from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register

NAME = "unstable"
LIST_EVERY = 3
TENSOR_EVERY = 2
INTO_TENSOR_GAP = Gap({"collective": "all_gather", "dtype": "int64"},
                      "planted: all_gather_into_tensor of int64 comes back zeroed (every second call)")
GATHER_GAP = Gap({"collective": "gather", "dtype": "float32"},
                 "planted: gather of float32 is declared intermittent and never deviates", outcome="intermittent")

_list_calls = itertools.count(1)
_tensor_calls = itertools.count(1)


class UnstableGloo(GlooWrapper):
    """gloo whose all_gather deviates on every few calls, counted per rank process."""

    def allgather(self, output_lists, input_tensors, opts):
        work = self.inner.allgather(output_lists, input_tensors, opts)
        if next(_list_calls) % LIST_EVERY:
            return work

        def rotate() -> None:
            for outputs in output_lists:
                gathered = [t.clone() for t in outputs]
                for i, out in enumerate(outputs):
                    out.copy_(gathered[(i + 1) % len(gathered)])

        return ThenWork(work, rotate, output_lists)

    def _allgather_base(self, output, input, opts):
        work = self.inner._allgather_base(output, input, opts)
        if next(_tensor_calls) % TENSOR_EVERY:
            return work
        return ThenWork(work, output.zero_, output)


_spec = register(NAME, UnstableGloo)
DISTCONFORM_SPEC = dataclasses.replace(_spec, gaps=(INTO_TENSOR_GAP, GATHER_GAP, *_spec.gaps))
