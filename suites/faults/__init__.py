"""Network faults on simulated hosts (issue 35): the table of faults, the clauses, the measurement tools.

``test_network_faults.py`` holds every backend to bounded waits, errors that name the operation or the peer,
and a declared state after healing, with each rank on a simulated host of its own (fixtures/hosts) and a fault of
``table.py`` injected on the last rank's host in the middle of a job. ``python -m suites.faults.measure`` measures
what torch does under any fault of the table (docs/faults.md).
"""
