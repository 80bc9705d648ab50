"""How pytest-xdist hands the project's own tests to its workers (tests/conftest.py wires it in).

Every test goes out alone, in collection order (starts_first puts the
longest first), a worker holding one test and the next; except that the
tests of a module in ``SHARED_RUNS`` go out together, as one unit, to one
worker. Their module-scoped fixtures are pytest runs of the suite, and a
module-scoped fixture is made once per worker that runs one of its tests:
with every test alone, test_cli.py's nine runs were made by all three
workers (42-57 s each under CI's load), test_rpc_plugin.py's,
test_reports.py's and test_report_html.py's alike, about 200 s of a 3230 s
run's worker time.

pytest-xdist's own ``--dist loadgroup`` with ``xdist_group`` marks would do
this, but pytest-xdist 3.8 tags a grouped test by assigning ``item._nodeid``,
which pytest 9.2 no longer reads (a node id is ``item._id``): the groups
never reach the controller. So this is pytest-xdist's ``loadscope``
scheduler (its declared hook ``pytest_xdist_make_scheduler``) with scopes of
our choosing, which needs no marks: the controller sees only node ids.
"""

from __future__ import annotations

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

# Modules whose tests share module-scoped pytest runs of the suite (each keeps its fixtures' reason beside them).
SHARED_RUNS = frozenset({
    "tests/test_cli.py",  # cheap_runs: nine pytest runs that start no world
    "tests/test_rpc_plugin.py",  # cheap_runs, futures_run: runs of the RPC suites
    "tests/test_reports.py",  # run: one run whose report every test reads
    "tests/test_report_html.py",  # run: one run whose report.html every test reads
})


class SharedRunsTogether(LoadScopeScheduling):
    """pytest-xdist's loadscope with a scope per test, or per module for SHARED_RUNS, in collection order."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # loadscope's default puts the largest scopes first

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in SHARED_RUNS else nodeid
