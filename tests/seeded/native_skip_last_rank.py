"""Seeded bug in the native backend: every reduction leaves out the last rank's contribution.

In the C++ round loop (native/segment.cpp) and in all_reduce's pipeline for
large tensors (native/collectives.cpp), both under planted bug ``skip_last_rank``,
the list of sources a rank reduces drops its last entry, the classic off-by-one
over ranks. all_reduce, reduce and reduce_scatter then miss the highest rank's
data. Caught by the all_reduce clause (suites/c10d/test_all_reduce.py::
test_all_reduce: the sum of every rank's input).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_skip_last_rank", "skip_last_rank",
                                       "reductions skip the last rank")
