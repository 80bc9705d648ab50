"""The rank side of tests/test_native.py: what each rank process it starts runs (``python -c "from
tests.harness_cases.native_ranks import <function>; ..."``).

Apart from its rank functions' own lazy imports (torch, the native backend) this module imports only the standard
library: each of the test's 18 rank processes would otherwise import pytest with tests/test_native.py for nothing.
"""

from __future__ import annotations

import json
import os

SEGMENT_PREFIX = "distconform-native-"


def _snapshot() -> dict:
    threads = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                threads.append(fh.read().strip())
        except FileNotFoundError:
            pass
    with open("/proc/self/maps") as fh:
        maps = [line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                for line in fh if SEGMENT_PREFIX in line]
    return {
        "native_threads": sorted(t for t in threads if t.startswith("native-")),
        "maps": maps,
        "fds": sorted(os.listdir("/proc/self/fd")),
        "shm": sorted(name for name in os.listdir("/dev/shm") if name.startswith(SEGMENT_PREFIX)),
    }


def lifecycle_rank(store_path: str, rank: int, world_size: int, out_path: str) -> None:
    """One rank: snapshot, init, use every path (collective, subgroup, p2p), snapshot, destroy, snapshot."""
    import gc
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import native  # noqa: F401  (registers the backend)

    store = dist.FileStore(store_path, world_size)
    before = _snapshot()
    dist.init_process_group("native", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    tensor = torch.ones(1 << 16)
    dist.all_reduce(tensor)
    sub = dist.new_group(list(range(world_size)))
    dist.broadcast(tensor, 0, group=sub)
    if rank == 0:
        dist.send(tensor, 1)
    elif rank == 1:
        dist.recv(tensor, 0)
    dist.barrier()
    during = _snapshot()
    dist.destroy_process_group()
    del sub
    gc.collect()
    after = _snapshot()
    with open(out_path, "w") as fh:
        json.dump({"before": before, "during": during, "after": after, "sum": tensor.sum().item()}, fh)


def dead_peer_rank(store_path: str, rank: int, world_size: int, scenario: str, victim: str, out_path: str) -> None:
    """One rank of a group that loses ``victim`` (SIGKILL) while the others wait on it in ``scenario``."""
    import signal
    import threading
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import native  # noqa: F401  (registers the backend)

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("native", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    victim_rank = int(victim)
    dist.barrier()  # everybody attached and alive
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    if rank == victim_rank:
        if scenario == "all_reduce":  # killed while the loop below is in some collective's rounds
            threading.Timer(0.5, die).start()
        elif scenario in ("recv", "send"):
            time.sleep(0.5)
            die()
        else:  # the others wait for it in the barrier
            die()
    error, elapsed = None, None
    big = torch.ones(4 << 20)  # 16 MiB: every all_reduce takes several rounds
    small = torch.zeros(4)
    stop_at = time.monotonic() + 20
    while error is None and time.monotonic() < stop_at:
        started = time.monotonic()
        try:
            if scenario == "all_reduce":
                dist.all_reduce(big)
            elif scenario == "barrier":
                dist.barrier()
            elif scenario == "send":  # 4 MiB through a 1 MiB ring nobody drains: blocked on ring space
                dist.send(big[: 1 << 20], victim_rank)
            else:
                dist.recv(small, victim_rank)
        except Exception as exc:  # noqa: BLE001  (the failure is what this rank reports)
            elapsed, error = time.monotonic() - started, str(exc)  # timed before the C++ backtrace is rendered
    dist.destroy_process_group()
    with open(out_path, "w") as fh:
        json.dump({"error": error, "elapsed": elapsed, "after": _snapshot()}, fh)


def recorder_rank(store_path: str, rank: int, world_size: int, size: str, out_path: str) -> None:
    """One rank of two, with TORCH_FR_BUFFER_SIZE=``size``: an all_reduce and a broadcast, a send (rank 0) and
    its recv (rank 1), then an all_reduce of a 0.5 s group rank 1 stays away from (rank 0's fails); then native's
    own flight recorder as both dumps (native/flight_recorder.py)."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = size  # read when the process makes its first native group
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from native import build, flight_recorder

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("native", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    dist.all_reduce(torch.ones(4))
    dist.broadcast(torch.zeros(2, 3, dtype=torch.int64), 0)
    if rank == 0:
        dist.send(torch.ones(5), 1)
    else:
        dist.recv(torch.empty(5), 0)
    short = dist.new_group(timeout=timedelta(seconds=0.5))
    error = None
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(1), group=short)
        except Exception as exc:  # noqa: BLE001  (the expected timeout)
            error = str(exc)
        store.set("failed", "1")
    else:
        store.wait(["failed"])
    extension = build.load()
    pickled = flight_recorder.dump(extension, pickled=True)
    with open(out_path, "w") as fh:
        json.dump({"json": flight_recorder.dump(extension, pickled=False), "error": error,
                   "short": short.group_name,
                   "pickled_types": sorted({type(e["process_group"]).__name__ for e in pickled["entries"]}
                                           | {type(row["last_enqueued_collective"]).__name__
                                              for row in pickled["pg_status"].values()})}, fh)
