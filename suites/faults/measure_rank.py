"""One rank of a fault measurement: ``python -m suites.faults.measure_rank SCENARIO RANK DIR``, run on a host.

The controller (suites/faults/measure.py) starts it inside a host's namespace with ``MASTER_ADDR``,
``MASTER_PORT`` and ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` set, and steers it through files in DIR
(``go``: the network is now cut; ``healed``: it is whole again), because the controller's own
connections would be cut by the very fault it injects. Each timed call is one JSON line in
``DIR/rank<R>.jsonl``. The rank never shuts down gracefully (a graceful RPC shutdown under a partition
has no bound): it leaves with ``os._exit`` and the controller kills whatever is left.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

PG_TIMEOUT_S = 4.0
RPC_TIMEOUT_S = 3.0
PAYLOAD_ENV = "DISTCONFORM_FAULT_PAYLOAD"  # bytes each call moves (the fault's min_payload; default 4 KiB)
WAIT_FILE_S = 120.0
HEALED_CALLS = 6  # at most this many calls after healing


def _die_with_parent() -> None:
    # the controller may be killed: no rank may outlive it (ip netns exec execs us, so it is our parent)
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Recorder:
    def __init__(self, directory: str, rank: int) -> None:
        self.directory, self.rank = directory, rank
        self.path = os.path.join(directory, f"rank{rank}.jsonl")

    def mark(self, name: str) -> None:
        open(os.path.join(self.directory, f"rank{self.rank}.{name}"), "w").close()

    def wait_for(self, name: str) -> None:
        deadline = time.monotonic() + WAIT_FILE_S
        while not os.path.exists(os.path.join(self.directory, name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: no {name!r} from the controller in {WAIT_FILE_S} s")
            time.sleep(0.05)

    def timed(self, phase: str, call: Callable[[], Any]) -> bool:
        """Time one call and write its outcome (seconds, the error's type and text); True when it returned."""
        start = time.perf_counter()
        record: dict[str, Any] = {"rank": self.rank, "phase": phase}
        try:
            call()
            record["ok"] = True
            record["seconds"] = round(time.perf_counter() - start, 3)
        except Exception as exc:  # the measurement is the error itself
            # timed before str(exc): rendering a C++ error's backtrace takes time
            record["seconds"] = round(time.perf_counter() - start, 3)
            record.update(ok=False, error_type=type(exc).__name__, error=str(exc)[:600])
        with open(self.path, "a") as out:
            out.write(json.dumps(record) + "\n")
        return bool(record["ok"])


def _numel() -> int:
    return max(1, int(os.environ.get(PAYLOAD_ENV, "4096")) // 4)  # float32


def gloo(recorder: Recorder, rank: int, lazy: bool, backend: str = "gloo") -> None:
    import torch
    import torch.distributed as dist

    if backend == "reference":
        import backends.reference  # noqa: F401  (registers it)
    dist.init_process_group(backend, rank=rank, world_size=2, timeout=timedelta(seconds=PG_TIMEOUT_S))
    tensor = torch.ones(_numel())

    def all_reduce() -> None:
        dist.all_reduce(tensor)

    if not lazy:  # the group's connections exist before the fault: a partition in the middle of a job
        for _ in range(3):
            all_reduce()
    recorder.mark("ready")
    recorder.wait_for("go")
    recorder.timed("faulted", all_reduce)
    recorder.timed("faulted-again", all_reduce)
    recorder.wait_for("healed")
    for attempt in (1, 2):
        recorder.timed(f"healed-{attempt}", all_reduce)


def tensorpipe(recorder: Recorder, rank: int, agent: str = "tensorpipe") -> None:
    import torch

    if agent == "tensorpipe":
        import torch.distributed.rpc as rpc

        options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=RPC_TIMEOUT_S, _transports=["uv"], _channels=["basic"])
    else:  # the reference agent of that name, its transport on TP_SOCKET_IFNAME's address as TensorPipe's
        import backends.reference.rpc as rpc

        options = rpc.ReferenceRpcBackendOptions(agent=agent, rpc_timeout=RPC_TIMEOUT_S)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    peer = f"worker{1 - rank}"
    payload = torch.ones(_numel())

    def call() -> None:
        rpc.rpc_sync(peer, torch.add, args=(payload, 1))

    call()
    recorder.mark("ready")
    recorder.wait_for("go")
    recorder.timed("faulted", call)
    recorder.wait_for("healed")
    # the first calls after healing may still meet TCP's retransmission back-off or a reset connection:
    # keep calling (bounded) until two in a row succeed, so the record shows when the agent works again
    streak = 0
    for attempt in range(1, HEALED_CALLS + 1):
        streak = streak + 1 if recorder.timed(f"healed-{attempt}", call) else 0
        if streak == 2:
            break


def main(argv: list[str]) -> int:
    scenario, rank, directory = argv[0], int(argv[1]), argv[2]
    _die_with_parent()
    recorder = Recorder(directory, rank)
    if scenario in ("gloo", "reference"):
        gloo(recorder, rank, lazy=False, backend=scenario)
    elif scenario == "gloo-lazy":
        gloo(recorder, rank, lazy=True)
    elif scenario in ("tensorpipe", "reference-tp"):
        tensorpipe(recorder, rank, agent=scenario)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    recorder.mark("done")
    # stay until the peer is done too: a rank that leaves first resets its connections, and the peer's
    # later calls would measure that exit (ECONNRESET, EOF) instead of the healed network
    try:
        recorder.wait_for(f"rank{1 - rank}.done")
    except TimeoutError:
        pass  # the controller kills what is left
    sys.stdout.flush()
    os._exit(0)  # no graceful shutdown: under a fault it may never return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
