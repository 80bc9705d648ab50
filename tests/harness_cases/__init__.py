"""Helper modules for the harness's own tests (tests/test_*.py).

Nothing here matches pytest's ``test_*.py`` pattern, so a plain ``pytest tests``
run does not collect these modules; tests that need them pass a path or a
module name explicitly (rank functions, plugin backends, an injected-failure
test module run in a subprocess pytest).
"""
