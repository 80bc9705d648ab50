"""Thin pytest wiring: the harness and the report writers are plugins living in
fixtures/ and reports/; this file only loads them."""

pytest_plugins = ["fixtures.pytest_plugin", "fixtures.workers", "fixtures.repeat", "fixtures.rpc_plugin", "reports.collector"]
