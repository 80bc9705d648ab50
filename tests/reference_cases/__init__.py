"""Module-level code for tests/test_reference_backend.py that runs in subprocesses."""
