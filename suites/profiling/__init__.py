"""Remote profiling over RPC: what the legacy profiler shows of remote work, on every agent, versus TensorPipe.

Run::

    pytest suites/profiling/ --rpc-agent tensorpipe,reference-tp,reference-pg --world-size 2,3

* ``workloads.py``   the RPCs profiled (and the callee functions), modes sync/async/remote,
                     known deviations as data;
* ``capture.py``     rank side: profile a workload, return its events as plain data;
* ``parity.py``      event multisets, TensorPipe's baseline by rule (transport work left out,
                     racing callee groups complete, the rest exact), the report files (``<report-dir>/profiling/parity.md`` / ``parity.json``), trace checks;
* ``conftest.py``    the TensorPipe baseline world (TensorPipe starts once per process and,
                     in torch 2.13, profiles only the first profiled request of each worker
                     thread, so it runs on a world of its own with 1024 worker threads);
* ``measure.py``     ``python -m suites.profiling.measure``: which of TensorPipe's events vary,
                     and the rule that covers each (the numbers behind parity.py's rule);
* ``test_parity.py`` / ``test_remote_events.py``  the clauses.

The reference agents' side is backends/reference/rpc/profiling.py.
"""
