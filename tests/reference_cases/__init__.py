"""Helpers for the reference backend's tests (tests/test_reference_*.py): in-process worlds, fuzz inputs,
what the reference DDP's tests share, and a rank program run in subprocesses (plain_dist)."""
