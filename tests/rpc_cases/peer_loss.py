"""A peer process that really dies under a reference-pg transport.

A World cannot host this case (a dead rank kills its world before the
survivors can report), so tests/test_rpc_transports.py forks plain processes
from the test process (torch is already imported there: a fork costs
milliseconds, a spawn seconds). Each process joins a default group over a
FileStore, starts a PgTransport, and the last rank exits hard once everyone
is up; the survivors report what they saw through a pipe.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

LOSS_WAIT_S = 10.0


def survivor_view(backend: str, rank: int, world_size: int, store_path: str, conn) -> None:
    """Process body: report {'lost': [...], 'send_error': str, 'shutdown_s': float} or an error string."""
    try:
        conn.send(_run(backend, rank, world_size, store_path))
    except BaseException as exc:  # the parent shows it
        import traceback

        conn.send({"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})
    finally:
        conn.close()
        os._exit(0)  # no atexit: the dead peer would make a clean destroy wait


def _run(backend: str, rank: int, world_size: int, store_path: str) -> dict:
    import torch.distributed as dist

    import backends.reference  # noqa: F401  registers the reference backend
    from backends.reference.rpc.pg_transport import PgTransport
    from backends.reference.rpc.transport import Frame, Kind, TransportError
    from tests.rpc_cases.transport_fns import Inbox

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=30))
    inbox, transport = Inbox(), PgTransport()
    transport.start(rank, world_size, dist.PrefixStore("rpc", store), inbox.deliver, inbox.on_peer_lost)
    store.set(f"up/{rank}", "1")
    store.wait([f"up/{r}" for r in range(world_size)])
    victim = world_size - 1
    if rank == victim:
        time.sleep(0.2)  # let every listener block in its receive first
        os._exit(3)
    out: dict = {}
    # gloo tells the listener at once; the reference backend only fails a send to the dead peer
    deadline = time.monotonic() + 1.0
    with inbox.cond:
        inbox.cond.wait_for(lambda: any(peer == victim for peer, _ in inbox.lost), 1.0)
    while time.monotonic() < deadline and not inbox.lost:
        time.sleep(0.01)
    out["lost_before_send"] = sorted({peer for peer, _ in inbox.lost})
    try:
        for _ in range(3):  # a socket may take a write or two to notice
            transport.send(victim, Frame(int(Kind.PYTHON_CALL), 1, b"to the dead"))
            time.sleep(0.2)
        out["send_error"] = "sent"
    except TransportError as exc:
        out["send_error"] = str(exc)
    out["lost"] = sorted({peer for peer, _ in inbox.lost})
    out["reasons"] = [reason for _, reason in inbox.lost]
    start = time.monotonic()
    transport.shutdown()
    out["shutdown_s"] = time.monotonic() - start
    return out
