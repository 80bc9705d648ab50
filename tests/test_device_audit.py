"""Clauses place their tensors on the rank's device (issue 23), checked on CPU with a fake device.

tests/harness_cases/device_audit.py gives the ranks a fake device and logs every torch.distributed call
handed a tensor that is not on it. One pytest run holds the planted clauses (each hard-codes a device in
another way) and a set of real ones: the planted ones must be in the log, the real ones must not.
"""

from __future__ import annotations

import json
import os
import sys

from tests.harness_cases import device_audit
from tests.harness_cases import warm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANTED = "tests/harness_cases/device_planted.py"
REAL_CLAUSES = ("suites/c10d/test_all_reduce.py", "suites/c10d/test_broadcast_reduce.py", "suites/p2p/test_send_recv.py",
                "suites/ddp/test_gradients.py")


def test_planted_hard_coded_devices_are_caught_and_real_clauses_are_clean(tmp_path):
    log = tmp_path / "audit.jsonl"
    env = {**os.environ, device_audit.LOG_ENV: str(log)}
    proc = warm.run(
        [sys.executable, "-m", "pytest", PLANTED, *REAL_CLAUSES, "--backend", "gloo", "--world-size", "2",
         "--backend-plugin", "tests.harness_cases.device_audit", "-n", "0", "-q", "-p", "no:cacheprovider",
         "--report-dir", str(tmp_path / "report")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    # the audit only records: every outcome is what it is without it
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    where = {(r["at"].split(" in ")[-1], r["rank"]) for r in records}
    bad = {"bad_hard_coded_cpu", "bad_device_string", "bad_default_device"}
    assert where == {(name, rank) for name in bad for rank in (0, 1)}, records
    by_clause = {r["at"].split(" in ")[-1]: r for r in records}
    assert by_clause["bad_hard_coded_cpu"]["tensor"].startswith("cpu(device='cpu') at " + PLANTED)
    assert by_clause["bad_device_string"]["call"] == "torch.distributed.distributed_c10d.broadcast"
    assert by_clause["bad_default_device"]["tensor"].startswith("zeros() without device=")
