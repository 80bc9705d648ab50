"""Network faults on simulated hosts (issue 35); for now a measurement tool, not conformance clauses.

``python -m suites.faults.measure`` measures what gloo and TensorPipe do when a host's network fails (suites/faults/table.py) in
the middle of a job (docs/faults.md). There is no test_*.py here: ``pytest suites/`` collects nothing
from this folder until the fault clauses exist.
"""
