"""``python -m suites.faults.measure_reconfigure [gloo|reference]``: partition, detect, reconfigure, heal, grow back (torch 2.14).

Run with a torch that has reconfigure (``~/.cache/distconform/tox/torch2141/bin/python``), as root (simulated
hosts, fixtures/hosts). Three hosts, one rank on each (``GLOO_SOCKET_IFNAME=eth0``), a FileStore on the shared
file system (the partition cuts the ranks' links, not the store). Phases, steered by files in a temporary
directory (the controller's own connections would be cut): every rank makes a reconfigurable gloo group,
reconfigures it with every handle and reduces; the controller cuts host 2 off; every rank all_reduces under
a DETECT_TIMEOUT_S timeout (the measurement: how long until it fails, with what, and get_error()); ranks 0
and 1 reconfigure without rank 2 (a fresh uuid) and reduce; the controller heals; all three reconfigure again
(another uuid) and reduce. One line per call: rank, phase, seconds, outcome. The clauses of the same scenario
are suites/faults/test_partition_recovery.py; docs/fault-tolerance.md records a run of both.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLD = 3
CUT = 2  # the rank whose host is partitioned
DETECT_TIMEOUT_S = 5.0
GROUP_TIMEOUT = timedelta(seconds=20)
WAIT_FILE_S = 120.0


# ------------------------------------------------------------------ a rank
def _rank(backend_name: str, rank: int, directory: str) -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the controller
    import torch
    import torch.distributed as dist

    if backend_name == "reference":
        import backends.reference  # noqa: F401  (registers it)
    out = open(os.path.join(directory, f"rank{rank}.jsonl"), "a")

    def record(phase: str, call) -> object:
        started, row = time.perf_counter(), {"rank": rank, "phase": phase}
        value = None
        try:
            value = call()
            row["seconds"] = round(time.perf_counter() - started, 2)
            row["result"] = value if isinstance(value, (int, float, str, list)) else None
        except Exception as exc:
            row["seconds"] = round(time.perf_counter() - started, 2)  # before str(exc): a C++ backtrace takes time
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        out.write(json.dumps(row) + "\n")
        out.flush()
        return value

    def wait_for(name: str) -> None:
        deadline = time.monotonic() + WAIT_FILE_S
        while not os.path.exists(os.path.join(directory, name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: no {name!r} in {WAIT_FILE_S} s")
            time.sleep(0.05)

    store = dist.FileStore(os.path.join(directory, "store"), WORLD)

    def handles(key: str, members: list[int]) -> list[str]:
        store.set(f"{key}/{rank}", dist._get_reconfigure_handle())
        return [store.get(f"{key}/{r}").decode() for r in members]

    def summed() -> float:
        tensor = torch.full((4,), dist.get_rank() + 1.0)
        dist.all_reduce(tensor)
        return tensor[0].item()

    dist.init_process_group(backend_name, store=store, rank=rank, world_size=WORLD, timeout=GROUP_TIMEOUT,
                            enable_reconfigure=True)
    backend = dist.get_backend_impl(dist.group.WORLD, torch.device("cpu"))
    everyone = list(range(WORLD))
    record("first", lambda: (dist._reconfigure(1, handles("first", everyone), timeout=GROUP_TIMEOUT).wait(),
                             [dist.get_world_size(), dist.get_rank(), summed()])[1])
    open(os.path.join(directory, f"rank{rank}.ready"), "w").close()
    wait_for("cut")
    backend.set_timeout(timedelta(seconds=DETECT_TIMEOUT_S))
    record("partitioned all_reduce", summed)
    record("get_error", lambda: backend.get_error().name)
    open(os.path.join(directory, f"rank{rank}.detected"), "w").close()
    survivors = [r for r in everyone if r != CUT]
    if rank in survivors:
        record("shrink", lambda: (dist._reconfigure(2, handles("shrink", survivors), timeout=GROUP_TIMEOUT).wait(),
                                  [dist.get_world_size(), dist.get_rank(), summed()])[1])
    open(os.path.join(directory, f"rank{rank}.shrunk"), "w").close()
    wait_for("healed")
    record("grow back", lambda: (dist._reconfigure(3, handles("grow", everyone), timeout=GROUP_TIMEOUT).wait(),
                                 [dist.get_world_size(), dist.get_rank(), summed()])[1])
    open(os.path.join(directory, f"rank{rank}.done"), "w").close()
    out.close()
    os._exit(0)  # no graceful teardown to wait on


# ------------------------------------------------------------- controller
def _wait(directory: str, name: str, ranks: list[int], bound_s: float) -> list[int]:
    """The ranks among ``ranks`` that did not mark ``name`` within ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        missing = [r for r in ranks if not os.path.exists(os.path.join(directory, f"rank{r}.{name}"))]
        if not missing:
            return []
        time.sleep(0.1)
    return missing


def main(backend_name: str) -> int:
    from fixtures.hosts import SimulatedHosts, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"cannot measure: {reason}", file=sys.stderr)
        return 4
    everyone = list(range(WORLD))
    with tempfile.TemporaryDirectory(prefix="ft-e2e-") as directory, SimulatedHosts(WORLD) as hosts:
        ranks = []
        for rank in everyone:
            env = dict(os.environ, **hosts[rank].socket_env(), PYTHONPATH=ROOT,
                       DISTCONFORM_REFERENCE_HOST=hosts[rank].address)  # where the reference listens
            log = open(os.path.join(directory, f"rank{rank}.log"), "wb")
            ranks.append(subprocess.Popen(
                [*hosts[rank].exec_prefix(), sys.executable, "-m", "suites.faults.measure_reconfigure", "--rank",
                 backend_name, str(rank), directory], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True))
        missing: list[str] = []
        try:
            for step, marks, bound in (("ready", everyone, 120.0), ("cut", None, 0), ("detected", everyone, 60.0),
                                       ("shrunk", everyone, 60.0), ("healed", None, 0), ("done", everyone, 90.0)):
                if marks is None:
                    if step == "cut":
                        hosts.partition(CUT)
                    else:
                        hosts.heal()
                    open(os.path.join(directory, step), "w").close()
                    continue
                late = _wait(directory, step, marks, bound)
                if late:
                    missing.append(f"ranks {late} not {step} within {bound:.0f} s")
                    break
        finally:
            for process in ranks:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        rows = []
        for rank in everyone:
            path = os.path.join(directory, f"rank{rank}.jsonl")
            if os.path.exists(path):
                rows += [json.loads(line) for line in open(path) if line.strip()]
        for row in rows:
            outcome = row.get("error") or f"-> {row.get('result')}"
            print(f"rank {row['rank']}  {row['phase']:<24} {row['seconds']:7.2f} s  {outcome}")
        for text in missing:
            print(f"NOT DONE: {text}")
            for rank in everyone:
                print(f"--- rank {rank} log tail:\n{open(os.path.join(directory, f'rank{rank}.log')).read()[-600:]}")
    return 0 if not missing else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        _rank(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gloo"))
