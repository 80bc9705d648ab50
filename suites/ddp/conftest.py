"""Implementation-level capability data for the DDP suite (see impls.IMPL_GAPS).

A case parametrised with ``impl`` whose (impl, clause) matches a gap becomes a
strict xfail carrying the gap's reason, exactly like a backend spec's gaps: it
still runs, and an implementation that gains the behaviour turns it red until
the gap is removed.
"""

import pytest

from suites.ddp import impls


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "impl" not in callspec.params:
            continue
        impl = callspec.params["impl"]
        gap = impls.gap_for(impl, item.originalname)
        if gap is None:
            continue
        if gap.outcome == "skip":
            item.add_marker(pytest.mark.skip(reason=f"{impl} DDP: {gap.reason}"))
        else:
            item.add_marker(pytest.mark.xfail(reason=f"{impl} DDP: {gap.reason}", strict=True))
