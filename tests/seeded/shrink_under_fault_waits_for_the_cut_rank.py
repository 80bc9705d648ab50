"""Seeded bug in the native backend, under a network fault: a shrunk group still counts the rank it excluded.

Not named native_<bug>.py: that name belongs to the one module per planted bug (tests/test_native.py); this one
registers the same planted bug under a backend of its own, for the fault area's shrink clause.

The planted bug of native_shrink_waits_for_excluded.py (``NativeBackend::shrink`` makes the shrunk group with the
excluded ranks still among its members, so building it waits for them to attach), met where the fault area meets
it: the cut-off rank frozen (SIGSTOP), the reachable ranks shrink it away and wait for it until the parent's
timeout instead of reducing over the rest. Native shares memory on one host, so of the table's faults only a frozen
peer and the store cut off reach it. Caught by
suites/faults/test_network_faults.py::test_the_reachable_ranks_shrink_the_group (--faults frozen).
"""

from tests.seeded.native_base import register_native_bug

DISTCONFORM_SPEC = register_native_bug("shrink_under_fault_waits_for_the_cut_rank", "shrink_waits_for_excluded",
                                       "shrink_group waits for the rank it excluded (under a frozen peer)")
