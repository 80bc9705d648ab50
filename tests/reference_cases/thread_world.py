"""A reference world inside this process: one ReferenceProcessGroup per rank, each built in a thread.

The groups rendezvous through one in-memory HashStore; ``run_on_all`` runs a
function on every rank's group in its own thread and names the rank that
raised or hung. Used by tests/test_reference_process_group.py and
tests/test_reference_transport.py, which also take the fixtures below
(``ref_world``, and the autouse ``backend_threads_never_die``) by importing them.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import backends.reference  # noqa: F401  registers "reference"
from backends.reference.process_group import ReferenceProcessGroup

LONG = timedelta(seconds=20)  # group timeout when a test is not about timeouts
HANG_S = 10.0  # a rank still running after this in run_on_all is hung


def run_each(items, fn, timeout: float = HANG_S) -> list:
    """fn(item) for every item, each in its own thread; per item its result or the exception it raised.

    A thread still running after ``timeout`` seconds fails the test, naming its rank.
    """
    items = list(items)
    outcomes: list = [None] * len(items)

    def body(index, item):
        try:
            outcomes[index] = fn(item)
        except BaseException as exc:  # noqa: BLE001 - reported per rank
            outcomes[index] = exc

    threads = [threading.Thread(target=body, args=(i, item), daemon=True, name=f"test-rank-{i}")
               for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, thread in enumerate(threads) if thread.is_alive()]
    if hung:
        raise AssertionError(f"ranks {hung} were still running after {timeout:g} s: hung")
    return outcomes


def run_on_all(items, fn, timeout: float = HANG_S) -> list:
    """fn(item) for every item (a rank's group, or a rank number) in threads; the results in rank order.

    Raises AssertionError naming every rank that raised (chained to the first error) or hung.
    """
    outcomes = run_each(items, fn, timeout)
    failed = [(rank, exc) for rank, exc in enumerate(outcomes) if isinstance(exc, BaseException)]
    if failed:
        raise AssertionError("; ".join(f"rank {rank} raised {type(exc).__name__}: {exc}" for rank, exc in failed)) \
            from failed[0][1]
    return outcomes


def make_world(n: int, timeout: timedelta = LONG, host: str | None = None,
               global_ranks: list[int] | None = None) -> list[ReferenceProcessGroup]:
    """n ReferenceProcessGroups of one world, built concurrently (they rendezvous through one HashStore)."""
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=HANG_S))
    return run_on_all(range(n), lambda rank: ReferenceProcessGroup(store, rank, n, timeout, global_ranks=global_ranks,
                                                                   host=host))


@pytest.fixture
def ref_world():
    """make_world, with every group built by the test shut down afterwards."""
    made: list[ReferenceProcessGroup] = []

    def make(n: int, timeout: timedelta = LONG, host: str | None = None, global_ranks: list[int] | None = None):
        pgs = make_world(n, timeout, host, global_ranks)
        made.extend(pgs)
        return pgs

    yield make
    for pg in made:
        pg.shutdown()


@pytest.fixture(autouse=True)
def backend_threads_never_die(monkeypatch):
    """Fail the test if any thread of the backend ('reference-*') ended with an exception meanwhile."""
    died: list[str] = []
    previous = threading.excepthook

    def hook(args):
        if args.thread is not None and args.thread.name.startswith("reference-"):
            died.append(f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
        previous(args)

    monkeypatch.setattr(threading, "excepthook", hook)
    yield
    assert not died, f"backend threads died of an exception (the process would lose them silently): {died}"


def all_reduce(pg, tensor, op=dist.ReduceOp.SUM, timeout: timedelta | None = None):
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    if timeout is not None:
        opts.timeout = timeout
    return pg.allreduce([tensor], opts)


def broadcast(pg, tensor, root):
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return pg.broadcast([tensor], opts)


def all_reduce_value(pg, value: float = 0.0, op=dist.ReduceOp.SUM):
    """Blocking all_reduce of [rank + 1 + value, 10 * (rank + 1)]; the result as a list."""
    rank = pg.rank()
    t = torch.tensor([rank + 1 + value, 10.0 * (rank + 1)])
    all_reduce(pg, t, op).wait()
    return t.tolist()


def expected_sum(n: int, value: float = 0.0):
    return [sum(r + 1 + value for r in range(n)), sum(10.0 * (r + 1) for r in range(n))]
