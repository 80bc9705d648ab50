"""Stress and performance tools; not conformance clauses (no test_*.py here).

``python -m suites.stress.collectives`` is the collective micro-benchmark,
modelled on nccl-tests (see collectives.py).
"""
