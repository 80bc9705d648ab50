"""Implementation-level capability data for the DDP suite (see impls.IMPL_GAPS).

A case parametrised with ``impl`` whose (impl, clause) matches a gap becomes a
strict xfail carrying the gap's reason, exactly like a backend spec's gaps: it
still runs, and an implementation that gains the behaviour turns it red until
the gap is removed.
"""

from fixtures.pytest_plugin import mark_gap
from suites.ddp import impls


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "impl" not in callspec.params:
            continue
        impl = callspec.params["impl"]
        mark_gap(item, impls.gap_for(impl, item.originalname), f"{impl} DDP")
