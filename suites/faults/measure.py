"""``python -m suites.faults.measure``: what gloo and TensorPipe do when a host's network fails mid-job.

Two simulated hosts (fixtures/hosts), one rank on each, each picking its interface the way users do
(``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME``, ``MASTER_ADDR`` = host 0's address). After the ranks are
ready the controller injects a fault of suites/faults/table.py on host 1 (``--fault``, default
``partition``: a silent drop both ways), lets them call, heals, lets them call again, and prints every
call's time and error. Scenarios:

- ``gloo``: a group whose connections exist, timeout 4 s;
- ``tensorpipe``: ``rpc_sync`` over TensorPipe's uv transport, ``rpc_timeout`` 3 s;
- ``reference``, ``reference-tp``: the reference backend (interface from ``DISTCONFORM_REFERENCE_IFNAME``) and
  the reference agent (``TP_SOCKET_IFNAME``) in gloo's and TensorPipe's places;
- ``gloo-lazy``: ``TORCH_GLOO_LAZY_INIT=1``, the first collective after the partition (slow: about 20 s,
  and rank 1 may never return; only when named).

Every phase is bounded; every process started is killed at the end and the namespaces are removed.
Needs root and ``ip netns``; nftables for the drop (tc otherwise). Not a conformance clause.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from fixtures.hosts import SimulatedHosts, unavailable_reason
from suites.faults.measure_rank import PAYLOAD_ENV, PG_TIMEOUT_S, RPC_TIMEOUT_S
from suites.faults.table import FAULTS, Fault, Target, named

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIOS = ("gloo", "tensorpipe", "gloo-lazy", "reference", "reference-tp")
MASTER_PORT = "29500"  # free by construction: host 0's namespace is new
READY_S = 120.0  # importing torch on a loaded 2-core machine
# how long the calls under the partition may take, per scenario: the timeout, its slack, and gloo-lazy's 5x
PARTITION_S = {"gloo": 20.0, "tensorpipe": 15.0, "gloo-lazy": 45.0, "reference": 20.0, "reference-tp": 15.0}
HEALED_S = 40.0  # six RPCs of at most 3 s each, or two collectives that fail at once


@dataclass
class Outcome:
    scenario: str
    fault: str
    records: list[dict]
    missing: list[str]  # what did not happen within its bound, in words


def _wait(predicate: object, bound_s: float) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def _records(directory: str) -> list[dict]:
    found: list[dict] = []
    for rank in (0, 1):
        path = os.path.join(directory, f"rank{rank}.jsonl")
        if os.path.exists(path):
            with open(path) as lines:
                found.extend(json.loads(line) for line in lines if line.strip())
    return found


def _phases(directory: str, phase: str) -> set[int]:
    return {r["rank"] for r in _records(directory) if r["phase"] == phase}


def _start_rank(hosts: SimulatedHosts, scenario: str, rank: int, directory: str, fault: Fault) -> subprocess.Popen[bytes]:
    host = hosts[rank]
    env = dict(os.environ, **host.socket_env(), MASTER_ADDR=hosts[0].address, MASTER_PORT=MASTER_PORT,
               PYTHONPATH=ROOT)
    env[PAYLOAD_ENV] = str(max(4096, fault.min_payload))
    if scenario == "gloo-lazy":
        env["TORCH_GLOO_LAZY_INIT"] = "1"
    log = open(os.path.join(directory, f"rank{rank}.log"), "wb")
    return subprocess.Popen(
        [*host.exec_prefix(), sys.executable, "-m", "suites.faults.measure_rank", scenario, str(rank), directory],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _kill(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: the rank and anything it started
        process.wait(timeout=10)


def measure(scenario: str, fault: Fault) -> Outcome:
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix=f"faults-{scenario}-") as directory, SimulatedHosts(2) as hosts:
        ranks = [_start_rank(hosts, scenario, rank, directory, fault) for rank in (0, 1)]
        target = Target(hosts, 1, ranks[1].pid, int(MASTER_PORT))  # ip netns exec execs: the pid is the rank's
        try:
            ready = lambda: all(os.path.exists(os.path.join(directory, f"rank{r}.ready")) for r in (0, 1))  # noqa: E731
            if not _wait(ready, READY_S):
                logs = " | ".join(open(os.path.join(directory, f"rank{r}.log")).read()[-400:] for r in (0, 1))
                return Outcome(scenario, fault.name, _records(directory), [f"ranks not ready in {READY_S} s: {logs}"])
            fault.inject(target)
            open(os.path.join(directory, "go"), "w").close()
            # a frozen rank writes nothing until thawed: only its peer's call is waited for
            expected = {0} if fault.name == "frozen" else {0, 1}
            if not _wait(lambda: _phases(directory, "faulted") >= expected, PARTITION_S[scenario]):
                stuck = sorted(expected - _phases(directory, "faulted"))
                missing.append(f"rank(s) {stuck} still in their first call after {PARTITION_S[scenario]:.0f} s "
                               f"under the fault {fault.name} (killed)")
            fault.heal(target)
            hosts.heal()
            open(os.path.join(directory, "healed"), "w").close()
            done = lambda: all(os.path.exists(os.path.join(directory, f"rank{r}.done")) for r in (0, 1))  # noqa: E731
            if not missing and not _wait(done, HEALED_S):
                missing.append(f"ranks not done {HEALED_S:.0f} s after healing (killed)")
            return Outcome(scenario, fault.name, _records(directory), missing)
        finally:
            _kill(ranks)


TIMEOUT_S = {"gloo": PG_TIMEOUT_S, "gloo-lazy": PG_TIMEOUT_S, "tensorpipe": RPC_TIMEOUT_S, "reference": PG_TIMEOUT_S,
             "reference-tp": RPC_TIMEOUT_S}
CSV_COLUMNS = ("scenario", "fault", "rank", "phase", "seconds", "timeout_s", "ratio_to_timeout", "ok",
               "error_type", "error")


def figures(outcomes: list[Outcome]) -> list[dict]:
    """One row per timed call: how long it took against the configured timeout, and what it raised."""
    rows = []
    for outcome in outcomes:
        timeout = TIMEOUT_S[outcome.scenario]
        for record in outcome.records:
            rows.append({"scenario": outcome.scenario, "fault": outcome.fault, "rank": record["rank"],
                         "phase": record["phase"], "seconds": record["seconds"], "timeout_s": timeout,
                         "ratio_to_timeout": round(record["seconds"] / timeout, 3), "ok": record["ok"],
                         "error_type": record.get("error_type", ""), "error": _first_line(record.get("error", ""))})
        rows.extend({"scenario": outcome.scenario, "fault": outcome.fault, "rank": "", "phase": "not done",
                     "seconds": "", "timeout_s": timeout, "ratio_to_timeout": "", "ok": False, "error_type": "",
                     "error": text} for text in outcome.missing)
    return rows


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def report(outcome: Outcome) -> str:
    lines = [f"== {outcome.scenario} / {outcome.fault}"]
    for record in outcome.records:  # each rank's in the order it made its calls
        result = "ok" if record["ok"] else f"{record['error_type']}: {_first_line(record['error'])}"
        lines.append(f"rank {record['rank']}  {record['phase']:<18} {record['seconds']:7.2f} s  {result}")
    lines.extend(f"NOT DONE: {text}" for text in outcome.missing)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.faults.measure", description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="gloo,tensorpipe",
                        help=f"comma-separated, of {', '.join(SCENARIOS)} (default gloo,tensorpipe)")
    parser.add_argument("--fault", default="partition",
                        help=f"comma-separated, of {', '.join(f.name for f in FAULTS)} (default partition)")
    parser.add_argument("--json", metavar="PATH", help="also write every record as JSON here")
    parser.add_argument("--csv", metavar="PATH", help="also write the figures (one row per call: seconds, "
                        "ratio to the timeout, error) as CSV here")
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenario.split(",") if s]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    try:
        faults = named(args.fault)
    except ValueError as exc:
        parser.error(str(exc))
    reason = unavailable_reason()
    if reason is not None:
        print(f"cannot measure: {reason}", file=sys.stderr)
        return 4
    outcomes = []
    for scenario in scenarios:
        for fault in faults:
            outcome = measure(scenario, fault)
            outcomes.append(outcome)
            print(report(outcome), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump([outcome.__dict__ for outcome in outcomes], out, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            writer.writerows(figures(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
