"""DDP and uneven-input (Join) contract suite.

Every clause runs torch's ``DistributedDataParallel`` and the reference reducer
(``backends.reference.ddp``), selected by the ``impl`` parameter, over the
default group of the backend under test (``--backend``), and compares them
with closed-form values from the spec (/work/shared/specs, parts A, B, D) or
with a single-process baseline built from the same seed.

* ``models.py``: the seeded models; ``common.py``: batches, baseline, comparison;
* ``impls.py``: the adapter over implementations; a backend may declare a gap
  for one implementation (``impl=``) or for ``impls.WORK_HELD_BY_CPP``
  (torch's Join divide-by-active path);
* ``test_*.py``: the clauses (gradients, buckets, unused parameters,
  no_sync and comm hooks, static graph, Join, construction errors);
* ``differential.py`` + ``test_differential.py``: hypothesis-generated runs
  against a single-process oracle, on the shared differential runner
  (suites/differential.py: ``--hypothesis-profile``, ``DISTCONFORM_REPLAY``).
"""
