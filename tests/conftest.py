"""The project's own tests run the conformance suite in subprocesses, each a handful of cases.

Those runs stay one process each (fixtures/workers.py gives a run over suites/
pytest-xdist workers by default): a test that wants workers passes ``-n``
itself, and the seeded-bug gallery runs several bugs at once instead
(tests/test_seeded_bugs.py). A value set by the caller is kept.
"""

import os

from fixtures.workers import ENV

os.environ.setdefault(ENV, "0")
