"""The reference backend's process group (backends/reference/process_group.py) tested directly, in one process.

A world is 2 or 3 ReferenceProcessGroup objects built in threads of this
process (tests/reference_cases/thread_world.py). On it:

* collectives and p2p give the right values at world sizes 2 and 3;
* disagreeing ranks, missing ranks and per-call timeouts raise on every rank
  with the operation, the ranks and the difference in the message;
* the Work API (is_completed, get_future, exception, _source_rank) behaves;
* shutdown and the exit hook end every backend thread;
* two real processes use the backend through plain torch.distributed.

The transport under it (outsiders, garbled frames, where it listens) is
tests/test_reference_transport.py; the wire format is tests/test_reference_wire.py.
An autouse fixture fails any test during which a backend thread (named
``reference-*``) died of an exception.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from backends.reference import process_group
from backends.reference.process_group import CollectiveMismatch
from tests.harness_cases.procs import REPO_ROOT
from tests.reference_cases.thread_world import (all_reduce, all_reduce_value, broadcast, expected_sum, run_each,
                                                 run_on_all)
from tests.reference_cases.thread_world import backend_threads_never_die, ref_world  # noqa: F401  (pytest fixtures)

try:
    from torch.distributed import AllgatherOptions
except ImportError:  # not re-exported by every torch
    from torch._C._distributed_c10d import AllgatherOptions

pytestmark = pytest.mark.timeout(120)


# ======================================================== 1. in-process worlds
def test_run_on_all_names_the_rank_that_raised_and_the_rank_that_hung():
    def fn(rank):
        if rank == 1:
            raise ValueError("boom")
        return rank

    with pytest.raises(AssertionError, match=r"rank 1 raised ValueError: boom"):
        run_on_all(range(3), fn)
    release = threading.Event()
    with pytest.raises(AssertionError, match=r"ranks \[2\] were still running"):
        run_on_all(range(3), lambda rank: release.wait(5) if rank == 2 else rank, timeout=0.2)
    release.set()


@pytest.mark.parametrize("n", [2, 3])
def test_in_process_world_runs_collectives_and_p2p(ref_world, n):
    pgs = ref_world(n)
    assert [pg.rank() for pg in pgs] == list(range(n)) and all(pg.size() == n for pg in pgs)
    assert all(pg.getBackendName() == "reference" for pg in pgs)

    assert run_on_all(pgs, all_reduce_value) == [expected_sum(n)] * n, "all_reduce SUM"
    maxes = run_on_all(pgs, lambda pg: all_reduce_value(pg, op=dist.ReduceOp.MAX))
    assert maxes == [[float(n), 10.0 * n]] * n, f"all_reduce MAX gave {maxes}"

    # large enough for the two-round (reduce-scatter + all-gather) path, and not a multiple of n
    big = 20_001
    def big_all_reduce(pg):
        t = torch.arange(big, dtype=torch.float64) * (pg.rank() + 1)
        all_reduce(pg, t).wait()
        return t
    expected = torch.arange(big, dtype=torch.float64) * sum(range(1, n + 1))
    for rank, got in enumerate(run_on_all(pgs, big_all_reduce)):
        assert torch.equal(got, expected), f"two-round all_reduce wrong on rank {rank}"

    def bcast(pg):
        t = torch.arange(5) * 7 if pg.rank() == n - 1 else torch.zeros(5, dtype=torch.int64)
        broadcast(pg, t, n - 1).wait()
        return t.tolist()
    assert run_on_all(pgs, bcast) == [[0, 7, 14, 21, 28]] * n, "broadcast from the last rank"

    def gather_all(pg):
        outs = [torch.zeros(2, dtype=torch.int32) for _ in range(n)]
        pg.allgather([outs], [torch.full((2,), pg.rank(), dtype=torch.int32)], AllgatherOptions()).wait()
        return [o.tolist() for o in outs]
    assert run_on_all(pgs, gather_all) == [[[r, r] for r in range(n)]] * n, "all_gather"

    run_on_all(pgs, lambda pg: pg.barrier(dist.BarrierOptions()).wait())

    def ring(pg):  # every rank sends to the next and receives from the previous
        rank = pg.rank()
        got = torch.zeros(3)
        recv = pg.recv([got], (rank - 1) % n, 11)
        pg.send([torch.full((3,), float(rank))], (rank + 1) % n, 11).wait()
        recv.wait()
        return got.tolist()
    assert run_on_all(pgs, ring) == [[float((r - 1) % n)] * 3 for r in range(n)], "p2p ring"


# ============================================================ 3. agreement errors
def _a2a(pg, in_splits, out_splits):
    output = torch.zeros(sum(out_splits))
    return pg.alltoall_base(output, torch.ones(sum(in_splits)), list(out_splits), list(in_splits),
                            dist.AllToAllOptions())


def _reduce_with(op):
    return lambda pg: all_reduce(pg, torch.ones(2), op)


MISMATCHES = {
    # name: (per-rank calls, texts every rank's error must contain)
    "shape": ([_reduce_with(dist.ReduceOp.SUM)] * 2 + [lambda pg: all_reduce(pg, torch.ones(3))],
              ["shape", "[2] on ranks [0, 1]", "[3] on ranks [2]"]),
    "dtype": ([_reduce_with(dist.ReduceOp.SUM), lambda pg: all_reduce(pg, torch.ones(2, dtype=torch.int64)),
               _reduce_with(dist.ReduceOp.SUM)],
              ["dtype", "'float32' on ranks [0, 2]", "'int64' on ranks [1]"]),
    "operation": ([lambda pg: broadcast(pg, torch.ones(2), 0)] + [_reduce_with(dist.ReduceOp.SUM)] * 2,
                  ["op", "'broadcast' on ranks [0]", "'all_reduce' on ranks [1, 2]"]),
    "root": ([lambda pg: broadcast(pg, torch.ones(2), 0)] * 2 + [lambda pg: broadcast(pg, torch.ones(2), 2)],
             ["root", "0 on ranks [0, 1]", "2 on ranks [2]"]),
    "reduce op": ([_reduce_with(dist.ReduceOp.SUM), _reduce_with(dist.ReduceOp.MAX), _reduce_with(dist.ReduceOp.SUM)],
                  ["reduce", "'sum' on ranks [0, 2]", "'max' on ranks [1]"]),
    "all_to_all_single splits": ([lambda pg: _a2a(pg, [1, 1, 1], [1, 1, 1]),
                                  lambda pg: _a2a(pg, [1, 1, 1], [2, 1, 1]),
                                  lambda pg: _a2a(pg, [1, 1, 1], [1, 1, 1])],
                                 ["rank 0 sends 1 rows to rank 1, which expects 2"]),
}


@pytest.mark.parametrize("mismatch", list(MISMATCHES))
def test_disagreeing_ranks_all_raise_naming_the_ranks_and_the_difference(ref_world, mismatch):
    calls, texts = MISMATCHES[mismatch]
    pgs = ref_world(3)

    def call(pg):
        calls[pg.rank()](pg).wait()

    outcomes = run_each(pgs, call)
    for rank, outcome in enumerate(outcomes):
        assert isinstance(outcome, CollectiveMismatch), \
            f"{mismatch} mismatch: rank {rank} got {outcome!r}, expected a CollectiveMismatch"
        for text in texts:
            assert text in str(outcome), f"{mismatch} mismatch: rank {rank}'s error lacks {text!r}: {outcome}"
    differences = {str(o).split("): ", 1)[-1] for o in outcomes}  # each names its own call in "(...)"
    assert len(differences) == 1, f"ranks described the mismatch differently: {[str(o) for o in outcomes]}"
    # every rank consumed the collective: the group is still usable
    assert run_on_all(pgs, all_reduce_value) == [expected_sum(3)] * 3, f"all_reduce after the {mismatch} mismatch"


# =================================================================== 4. timeouts
def _timed(fn):
    started = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_rank_that_skips_an_all_reduce_makes_the_others_raise_after_the_group_timeout(ref_world):
    timeout_s = 0.3
    # a subgroup of a larger world: group rank 2 is global rank 8, and the error must say both
    pgs = ref_world(3, timeout=timedelta(seconds=timeout_s), global_ranks=[4, 6, 8])

    def maybe_all_reduce(pg):
        if pg.rank() == 2:
            return None
        return _timed(lambda: all_reduce(pg, torch.ones(2)).wait())

    for rank, outcome in enumerate(run_each(pgs, maybe_all_reduce)[:2]):
        elapsed, exc = outcome
        assert exc is not None, f"rank {rank}'s all_reduce succeeded without rank 2"
        assert timeout_s <= elapsed <= timeout_s + 2, \
            f"rank {rank} raised after {elapsed:.2f} s, outside [{timeout_s}, {timeout_s + 2}] s: {exc}"
        for text in ["all_reduce", "Timed out", "ranks [2]", "global ranks [8]"]:
            assert text in str(exc), f"rank {rank}'s timeout error lacks {text!r}: {exc}"


def test_a_per_call_timeout_overrides_the_long_group_timeout(ref_world):
    pgs = ref_world(2, timeout=timedelta(seconds=60))
    elapsed, exc = _timed(lambda: all_reduce(pgs[0], torch.ones(2), timeout=timedelta(seconds=0.2)).wait())
    assert exc is not None, "an all_reduce without its peer succeeded"
    assert 0.2 <= elapsed <= 2.2, f"the per-call timeout of 0.2 s fired after {elapsed:.2f} s: {exc}"
    assert "all_reduce" in str(exc) and "ranks [1]" in str(exc), f"the timeout error names neither: {exc}"


def test_a_recv_whose_sender_never_sends_raises_naming_source_and_tag(ref_world):
    timeout_s = 0.3
    pgs = ref_world(2, timeout=timedelta(seconds=timeout_s))
    got = torch.zeros(2)
    work = pgs[1].recv([got], 0, 7)
    elapsed, exc = _timed(work.wait)
    assert exc is not None, "a recv whose sender never sent succeeded"
    assert timeout_s <= elapsed <= timeout_s + 2, f"the recv raised after {elapsed:.2f} s (group timeout {timeout_s} s)"
    assert "rank 0" in str(exc) and "tag 7" in str(exc), f"the recv's timeout error names neither source nor tag: {exc}"
    # the timed-out receive was withdrawn: a message sent now goes to the next receive, not into the void.
    # Waited on with a timeout of their own: the group's 0.3 s is the subject above, not a bound on how soon a
    # loaded machine's reader thread delivers (CI saw this second recv time out at 0.3 s). A receive left posted
    # (cancel not removing it) still fails here, after 10 s
    pgs[0].send([torch.full((2,), 4.0)], 1, 7).wait(timedelta(seconds=10))
    pgs[1].recv([got], 0, 7).wait(timedelta(seconds=10))
    assert got.tolist() == [4.0, 4.0], "the message went to the receive that had timed out"


# ============================================================ lazy connection
def test_a_lazy_group_connects_each_pair_at_its_first_use(ref_world, monkeypatch):
    """DISTCONFORM_REFERENCE_LAZY_INIT=1 when a group is made: no connection until an operation needs the pair."""
    monkeypatch.setenv(process_group.LAZY_INIT_ENV, "1")
    pgs = ref_world(3)
    assert [pg.mesh.connected() for pg in pgs] == [[], [], []], "a lazy group connected when it was made"
    got = torch.zeros(2)
    run_on_all([0, 2], lambda rank: pgs[0].send([torch.full((2,), 5.0)], 2, 3).wait() if rank == 0
               else pgs[2].recv([got], 0, 3).wait())
    assert got.tolist() == [5.0, 5.0]
    assert [pg.mesh.connected() for pg in pgs] == [[2], [], [0]], "p2p connected more than its pair"
    assert run_on_all(pgs, all_reduce_value) == [expected_sum(3)] * 3
    assert [pg.mesh.connected() for pg in pgs] == [[1, 2], [0, 2], [0, 1]]


def test_a_lazy_first_collective_without_a_peer_raises_within_its_timeout_naming_it(ref_world, monkeypatch):
    monkeypatch.setenv(process_group.LAZY_INIT_ENV, "1")
    timeout_s = 0.5
    pgs = ref_world(3, timeout=timedelta(seconds=timeout_s))
    outcomes = run_each(pgs[:2], lambda pg: _timed(lambda: all_reduce(pg, torch.ones(2)).wait()))
    for rank, (elapsed, exc) in enumerate(outcomes):
        assert exc is not None, f"rank {rank}'s first all_reduce succeeded without rank 2"
        assert timeout_s <= elapsed <= timeout_s + 2, f"rank {rank} raised after {elapsed:.2f} s (timeout {timeout_s} s)"
        assert "not dialled by ranks [2]" in str(exc), f"rank {rank}'s error does not name rank 2: {exc}"


# =================================================================== 5. Work API
def test_async_all_reduce_completes_only_after_every_rank_called(ref_world):
    pgs = ref_world(2)
    t0 = torch.tensor([1.0, 2.0])
    work0 = all_reduce(pgs[0], t0)
    time.sleep(0.05)
    assert not work0.is_completed(), "all_reduce completed before rank 1 had even called it"
    assert work0.exception() is None, "an unfinished Work reports an exception"
    t1 = torch.tensor([10.0, 20.0])
    work1 = all_reduce(pgs[1], t1)
    assert work0.wait() and work1.wait()
    assert work0.is_completed() and work1.is_completed() and work0.is_success()
    for work in (work0, work1):
        values = work.get_future().wait()
        assert [v.tolist() for v in values] == [[11.0, 22.0]], f"the future's value is {values}"
        assert work.exception() is None
    assert values[0] is t1, "the future's value is not the caller's tensor, reduced in place"


def test_results_land_without_recording_autograd_history_on_the_callers_tensor(ref_world):
    """The worker and reader threads write data only, never autograd history (the funcol backward bug).

    A functional all_reduce's output gets its AllReduceBackward node as soon as the op returns,
    before the worker writes the result into it. The worker's copy_ ran with grad mode on (it is
    per thread), so it rebased the output onto a CopyBackwards node whose gradient for the
    overwritten value is zero: 2-14 of 200 funcol backwards summed zeros for one rank. Here the
    caller's tensor has history *before* the call, which makes that ordering certain: every
    result must land in the tensor and leave its grad_fn the very same node (as gloo does).
    """
    pgs = ref_world(2)
    big = process_group.SMALL_ALL_REDUCE_BYTES // 4 + 8  # float32 elements: the two-round all_reduce

    def with_history(me, numel):
        x = torch.ones(numel, requires_grad=True)
        y = x * float(me + 1)  # a non-leaf, like a functional collective's output
        return x, y, y.grad_fn

    def on_rank(pg):
        me, seen = pg.rank(), {}

        def check(name, x, y, node, expected):
            y.sum().backward()  # through the history y had before the call: d(sum y)/dx = me + 1
            seen[name] = (type(y.grad_fn).__name__, y.grad_fn is node, y.detach()[:2].tolist(),
                          x.grad[:2].tolist())
            assert seen[name] == ("MulBackward0", True, expected, [float(me + 1)] * 2), \
                f"rank {me} {name}: (grad_fn, same node, values, x.grad) = {seen[name]}"

        for name, numel in (("all_reduce one round", 4), ("all_reduce two rounds", big)):
            x, y, node = with_history(me, numel)
            all_reduce(pg, y).wait()
            check(name, x, y, node, [3.0, 3.0])
        x, y, node = with_history(me, 4)
        broadcast(pg, y, root=1).wait()
        check("broadcast", x, y, node, [2.0, 2.0])
        # recv: the message arrives first (written on the caller's thread) / the recv is posted first
        # (written by the reader thread); the all_reduce in between orders the two cases
        if me == 0:
            pg.send([torch.full((4,), 7.0)], 1, 5).wait()
            all_reduce_value(pg)
            pg.send([torch.full((4,), 8.0)], 1, 6).wait()
        else:
            x6, y6, node6 = with_history(me, 4)
            posted = pg.recv([y6], 0, 6)
            all_reduce_value(pg)  # rank 0's tag-5 frame was read before its all_reduce frame
            x5, y5, node5 = with_history(me, 4)
            pg.recv([y5], 0, 5).wait()
            check("recv of an arrived message", x5, y5, node5, [7.0, 7.0])
            posted.wait()
            check("recv posted before the message", x6, y6, node6, [8.0, 8.0])
        return seen

    results = run_on_all(pgs, on_rank)
    assert set(results[1]) == {"all_reduce one round", "all_reduce two rounds", "broadcast",
                               "recv of an arrived message", "recv posted before the message"}


def test_an_error_in_an_async_op_is_raised_by_wait_and_exposed_by_exception(ref_world):
    pgs = ref_world(2)
    works = run_on_all(pgs, lambda pg: all_reduce(pg, torch.ones(2 + pg.rank())))  # shapes differ
    for rank, work in enumerate(works):
        with pytest.raises(CollectiveMismatch, match="shape"):
            work.wait()
        assert work.is_completed(), f"rank {rank}: a failed Work is not completed"
        assert not work.is_success(), f"rank {rank}: a failed Work reports success"
        assert isinstance(work.exception(), CollectiveMismatch), f"rank {rank}: exception() is {work.exception()!r}"
        with pytest.raises(CollectiveMismatch):
            work.get_future().wait()


def test_recv_anysource_reports_the_sender(ref_world):
    pgs = ref_world(3)
    # posted before the message arrives
    got = torch.zeros(2)
    work = pgs[2].recv_anysource([got], 3)
    assert not work.is_completed()
    pgs[1].send([torch.full((2,), 1.5)], 2, 3).wait()
    work.wait()
    assert work._source_rank() == 1 and got.tolist() == [1.5, 1.5], f"source {work._source_rank()}, got {got}"
    # the message is already there when the receive is posted
    pgs[0].send([torch.full((2,), 2.5)], 2, 4).wait()
    deadline = time.monotonic() + 5
    while not pgs[2].mesh.mailbox.frames.get(("p2p", 0, 4)) and time.monotonic() < deadline:
        time.sleep(0.005)
    work = pgs[2].recv_anysource([got], 4)
    work.wait()
    assert work._source_rank() == 0 and got.tolist() == [2.5, 2.5], f"source {work._source_rank()}, got {got}"


# ================================================================ 6. life cycle
def _threads_of(pgs) -> list[threading.Thread]:
    owners = [pg.mesh for pg in pgs] + [pg.mesh._listener for pg in pgs]  # the accept loop is the listener's
    return [pg._worker for pg in pgs] + [
        t for t in threading.enumerate() if any(getattr(getattr(t, "_target", None), "__self__", None) is m
                                                for m in owners)]


def test_shutdown_ends_every_thread_and_closes_the_listener(ref_world):
    pgs = ref_world(3)
    run_on_all(pgs, all_reduce_value)
    threads, ports = _threads_of(pgs), [pg.mesh.port for pg in pgs]
    assert len(threads) == 3 * (1 + 1 + 2), f"expected a worker, an accept and 2 reader threads per rank: {threads}"
    for pg in pgs:
        pg.shutdown()
    for thread in threads:
        thread.join(2.0)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running 2 s after shutdown(): {alive}"
    for port in ports:
        with pytest.raises(ConnectionRefusedError):  # nothing may listen on a shut-down group's port
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_the_exit_hook_shuts_groups_down_and_waits_for_their_threads(ref_world):
    """At interpreter exit a backend daemon thread must not still be in torch's C++ code (dropping the
    last reference to a Work releases and retakes the GIL): finalization would kill it with
    std::terminate and the process, after a clean run, aborts. The atexit hook joins them first."""
    pgs = ref_world(2)
    run_on_all(pgs, all_reduce_value)
    works = run_on_all(pgs, lambda pg: all_reduce(pg, torch.ones(1)))  # completed, still referenced
    run_on_all(works, lambda work: work.wait())
    threads = [t for t in _threads_of(pgs) if "accept" not in t.name]
    process_group._stop_threads_before_exit()
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"the exit hook returned while backend threads still run: {alive}"


# ================================================ 7. plain torch.distributed
def test_two_processes_use_the_backend_through_plain_torch_distributed(tmp_path):
    store = str(tmp_path / "filestore")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.reference_cases.plain_dist", str(rank), "2", store],
                              cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"rank {rank} of the plain torch.distributed world hung") from None
        assert proc.returncode == 0, f"rank {rank} exited with {proc.returncode}:\n{err[-3000:]}"
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert lines, f"rank {rank} printed no result:\n{out[-2000:]}\n{err[-2000:]}"
        results.append(json.loads(lines[-1][len("RESULT "):]))
    for rank, result in enumerate(results):
        expected = {
            "backend": "reference", "rank": rank, "world_size": 2,
            "all_reduce_sum": [3.0] * 3, "all_reduce_max": [2, 20], "broadcast": [100, 101, 102, 103],
            "all_gather": [[0.0, 0.0], [1.0, 1.0]], "p2p": None if rank == 0 else [7.0, 8.0],
            "new_group_all_reduce": [3.0, 3.0], "new_group_backend": "reference",
            "singleton_all_reduce": [float(rank + 5)], "initialized_after_destroy": False,
        }
        wrong = {k: (result.get(k), v) for k, v in expected.items() if result.get(k) != v}
        assert not wrong, f"rank {rank}: (got, expected) per call: {wrong}"



def test_a_peer_that_closed_is_seen_before_its_last_frame_is_read():
    """The send path's check (transport._hung_up) sees a peer's close while that peer's last frame is still unread:
    a rank whose reader has not got to the end must not complete a collective the peer gave up with that frame."""
    from backends.reference.transport import _hung_up

    with socket.create_server(("127.0.0.1", 0)) as listener:  # TCP: a FIN alone raises POLLRDHUP, not POLLHUP
        theirs = socket.create_connection(listener.getsockname())
        mine, _ = listener.accept()
    try:
        theirs.sendall(b"the frame of a collective the peer then abandoned")
        assert not _hung_up(mine), "an open connection with unread data is not closed"
        theirs.close()
        assert _hung_up(mine), "the peer's close was not seen while its frame was unread"
    finally:
        mine.close()
    assert _hung_up(mine), "a socket closed under the sender counts as gone"
