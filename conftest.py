"""Thin pytest wiring: the harness and the report writers are plugins living in
fixtures/ and reports/; this file only loads them."""

# fixtures.repeat first: fixtures.pytest_plugin imports it, and pytest rewrites only what it imports first
pytest_plugins = ["fixtures.repeat", "fixtures.pytest_plugin", "fixtures.workers", "fixtures.rpc_plugin", "reports.collector"]
