"""Contract: every entry point torch.distributed offers on a group works on the backend.

c10d reaches a backend through more doors than the 2020-era collectives: the
``*_coalesced`` functions, ``all_gather_into_tensor``/``reduce_scatter_tensor``
and their 2.13 names, the object collectives, ``monitored_barrier``, p2p in
its four spellings and ``batch_isend_irecv``. A Python ``ProcessGroup`` that
does not override one of them falls through to c10d's C++ base and fails with
"No backend type associated with device type cpu". Each entry point here is
called once, by every rank, with rank-specific inputs, and every rank's result
is compared with the oracle (backends/reference/semantics.py); a hole fails
the case named after that entry point, with the backend's own error.

The root of every rooted call is the last rank, so "root is rank 0" shortcuts show.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Callable

import pytest
import torch
import torch.distributed as dist

from fixtures.rank import ctx
from suites import collectives, values
from suites.checks import expect_tensor

NUMEL = 6  # elements per rank: divides into 1, 2, 3 and 6 chunks (world sizes 2, 3; 4 uses splits)


def x(rank: int, salt: int = 0, numel: int = NUMEL) -> torch.Tensor:
    """What rank ``rank`` contributes (element k is rank*1000 + k + salt)."""
    return values.rank_payload(rank, numel, "float32", salt)


def mine(salt: int = 0, numel: int = NUMEL) -> torch.Tensor:
    return x(ctx.rank, salt, numel).to(ctx.device)


def zeros(numel: int = NUMEL) -> torch.Tensor:
    return torch.full((numel,), -1.0, device=ctx.device)


def cpu(result):
    """Tensors (nested in lists/tuples/dicts) moved to cpu for the trip back."""
    if isinstance(result, torch.Tensor):
        return result.cpu()
    if isinstance(result, (list, tuple)):
        return type(result)(cpu(r) for r in result)
    if isinstance(result, dict):
        return {k: cpu(v) for k, v in result.items()}
    return result


def obj(rank: int) -> dict:
    """A rank-specific object whose pickled size differs per rank."""
    return {"rank": rank, "text": "o" * (5 + 31 * rank), "tensor": torch.arange(3) + rank}


# ------------------------------------------- rank side: the table's collectives
# A collective of suites/collectives.py is called through each of its entry points, with async_op=True
# where its record says so, and several calls of it as one (its ``*_coalesced`` function, or inside
# dist._coalescing_manager); every input chunk names its rank and position, the root is the last rank.
COALESCED_NUMELS = (NUMEL, 3)  # two calls issued as one, of different sizes (the seam shows)


def chunks_of(entry: collectives.Collective, rank: int, n: int, call: int = 0) -> list:
    """Rank ``rank``'s input chunks for call number ``call`` ([] where it passes none)."""
    if not entry.inputs.passed_by(rank == n - 1):
        return []
    return [x(rank, salt=7 * call + 10 * j, numel=COALESCED_NUMELS[call]) for j in range(entry.inputs.count(n))]


def _args(entry: collectives.Collective, call: int = 0, async_op: bool = False) -> collectives.Args:
    n = ctx.world_size
    chunks = [t.to(ctx.device) for t in chunks_of(entry, ctx.rank, n, call)]
    return collectives.args_for(entry, chunks, lambda j: zeros(COALESCED_NUMELS[call]), group_size=n,
                                is_root=ctx.rank == n - 1, op=dist.ReduceOp.SUM, root=n - 1, async_op=async_op)


def _results(entry: collectives.Collective, args: collectives.Args, call: int = 0) -> list:
    return collectives.result_chunks(entry, args, [COALESCED_NUMELS[call]] * ctx.world_size)


def call_collective(name: str, entry_point: str, async_op: bool = False) -> list:
    """One call of collective ``name`` through ``entry_point``: this rank's result chunks."""
    entry = collectives.get(name)
    args = _args(entry, async_op=async_op)
    work = entry.issue(args, entry_point)
    if async_op:
        work.wait()
    return _results(entry, args)


def call_coalesced(name: str) -> list:
    """Two calls of collective ``name`` in one call of its ``*_coalesced`` function: per call, result chunks."""
    entry = collectives.get(name)
    calls = [_args(entry, i) for i in range(len(COALESCED_NUMELS))]
    entry.issue_coalesced(collectives.Args([a.inputs[0] for a in calls], [a.outputs for a in calls if a.outputs],
                                           op=dist.ReduceOp.SUM))
    return [_results(entry, a, i) for i, a in enumerate(calls)]


def call_coalescing_manager(name: str) -> list:
    """Two calls of collective ``name`` inside dist._coalescing_manager: per call, result chunks."""
    entry = collectives.get(name)
    calls = [_args(entry, i) for i in range(len(COALESCED_NUMELS))]
    with dist._coalescing_manager():
        for a in calls:
            entry.issue(a)
    return [_results(entry, a, i) for i, a in enumerate(calls)]


def expected_call(name: str, n: int, call: int = 0) -> list:
    """Every rank's result chunks of one call of collective ``name`` (None: unspecified), by the table's oracle."""
    entry = collectives.get(name)
    return entry.oracle([chunks_of(entry, r, n, call) for r in range(n)], "sum" if entry.reduces else None,
                        n - 1 if entry.rooted else None)


def expected_calls(name: str, n: int) -> list:
    """Per rank, per call of a coalesced pair: its result chunks."""
    per_call = [expected_call(name, n, i) for i in range(len(COALESCED_NUMELS))]
    return [[per_call[i][r] for i in range(len(per_call))] for r in range(n)]


# ------------------------------------------ rank side: the other entry points
# Each returns this rank's result; its case gives the expectation in closed form.
def _barrier():
    dist.barrier()
    return None


def _monitored_barrier():
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    return None


def _all_gather_object():
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj(ctx.rank))
    return out


def _broadcast_object_list():
    objects = [obj(ctx.rank), ctx.rank]
    dist.broadcast_object_list(objects, src=ctx.world_size - 1)
    return objects


def _gather_object():
    root = ctx.world_size - 1
    out = [None] * ctx.world_size if ctx.rank == root else None
    dist.gather_object(obj(ctx.rank), out, dst=root)
    return out


def _scatter_object_list():
    root = ctx.world_size - 1
    out = [None]
    dist.scatter_object_list(out, [obj(100 + i) for i in range(ctx.world_size)] if ctx.rank == root else None,
                             src=root)
    return out[0]


def _send_recv_object_list():
    last = ctx.world_size - 1
    if ctx.rank == 0:
        dist.send_object_list([obj(0), "tail"], dst=last)
    elif ctx.rank == last:
        out = [None, None]
        dist.recv_object_list(out, src=0)
        return out
    return None


def _send_recv():
    last = ctx.world_size - 1
    if ctx.rank == 0:
        dist.send(mine(), dst=last, tag=3)
    elif ctx.rank == last:
        out = zeros()
        dist.recv(out, src=0, tag=3)
        return out
    return None


def _isend_irecv():
    nxt, prv = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    out = zeros()
    works = [dist.isend(mine(), dst=nxt), dist.irecv(out, src=prv)]
    for work in works:
        work.wait()
    return out


def _batch_isend_irecv():
    nxt, prv = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    out = zeros()
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine(), nxt), dist.P2POp(dist.irecv, out, prv)]):
        work.wait()
    return out


# ------------------------------------------------------ closed-form results
def _nothing(n: int) -> list:
    return [None] * n


def _objects_gathered(n: int) -> list:
    return [[obj(r) for r in range(n)]] * n


def _object_list_broadcast(n: int) -> list:
    return [[obj(n - 1), n - 1]] * n


def _objects_at_root(n: int) -> list:
    return [None] * (n - 1) + [[obj(r) for r in range(n)]]


def _objects_scattered(n: int) -> list:
    return [obj(100 + i) for i in range(n)]


def _object_list_received(n: int) -> list:
    return [None] * (n - 1) + [[obj(0), "tail"]]


def _tensor_received(n: int) -> list:
    return [None] * (n - 1) + [x(0)]


def _ring_received(n: int) -> list:
    return [x((r - 1) % n) for r in range(n)]


def expect_same(actual, expected, what: str) -> None:
    """Equal in structure, and tensors bit for bit (tensors inside objects too)."""
    if expected is None:
        return
    if isinstance(expected, torch.Tensor):
        expect_tensor(actual, expected, what)
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), \
            f"{what}: got {actual!r}, expected {len(expected)} entries"
        for i, (a, e) in enumerate(zip(actual, expected)):
            expect_same(a, e, f"{what}[{i}]")
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{what}: got {actual!r}"
        for key in expected:
            expect_same(actual[key], expected[key], f"{what}[{key!r}]")
    else:
        assert actual == expected, f"{what}: got {actual!r}, expected {expected!r}"


# ------------------------------------------------------------------ the cases
def _case(name: str, fn: Callable, expected: Callable[[int], list], min_world_size: int = 1, **needs) -> object:
    """The case of entry point ``name``: ``fn`` runs on every rank, ``expected(n)`` is every rank's result."""
    marks = [pytest.mark.needs(entry_point=name, **needs)]
    if min_world_size > 1:
        marks.append(pytest.mark.min_world_size(min_world_size))
    return pytest.param(name, fn, expected, id=name, marks=marks)


def table_cases() -> list:
    """Every entry point of every collective of suites/collectives.py, in table order; the table states
    each one's requirements (family and form). An entry point two records claim is called once."""
    cases: dict[str, object] = {}

    def add(name, fn, expected, entry, **needs):
        cases.setdefault(name, _case(name, fn, expected, **entry.need(), **needs))

    for entry in collectives.TABLE.values():
        single = partial(expected_call, entry.name)
        for entry_point in entry.entry_point_names:
            add(entry_point, partial(call_collective, entry.name, entry_point), single, entry)
        if entry.async_entry_point:
            add(f"{entry.name}_async", partial(call_collective, entry.name, None, True), single, entry)
    for entry in collectives.TABLE.values():
        if entry.coalesced.function:
            add(entry.coalesced.function, partial(call_coalesced, entry.name), partial(expected_calls, entry.name),
                entry, feature="coalescing")
    for entry in collectives.coalescing_managed():
        add(f"coalescing_manager_{entry.name}", partial(call_coalescing_manager, entry.name),
            partial(expected_calls, entry.name), entry, feature="coalescing")
    return list(cases.values())


OTHER_ENTRY_POINTS = [
    _case("barrier", _barrier, _nothing, collective="barrier"),
    _case("monitored_barrier", _monitored_barrier, _nothing, feature="monitored_barrier"),
    _case("all_gather_object", _all_gather_object, _objects_gathered, feature="object_collectives"),
    _case("broadcast_object_list", _broadcast_object_list, _object_list_broadcast, feature="object_collectives"),
    _case("gather_object", _gather_object, _objects_at_root, feature="object_collectives"),
    _case("scatter_object_list", _scatter_object_list, _objects_scattered, feature="object_collectives"),
    # to a peer: torch refuses a send to the own rank
    _case("send_recv_object_list", _send_recv_object_list, _object_list_received, min_world_size=2,
          feature="object_collectives"),
    _case("send_recv", _send_recv, _tensor_received, min_world_size=2, collective="send_recv"),
    # a ring of one rank is a send to itself, which gloo refuses and NCCL takes only inside a batch
    _case("isend_irecv", _isend_irecv, _ring_received, min_world_size=2, collective="send_recv"),
    _case("batch_isend_irecv", _batch_isend_irecv, _ring_received, min_world_size=2, collective="batch_isend_irecv"),
]
ENTRY_POINTS = table_cases() + OTHER_ENTRY_POINTS


class EntryPointFailed(AssertionError):
    pass


def call_entry_point(name: str, fn: Callable):
    """Run one entry point on this rank; a failure names the entry point, then the backend's error."""
    try:
        return cpu(fn())
    except Exception as exc:
        raise EntryPointFailed(f"dist.{name} failed on rank {ctx.rank} of backend {ctx.backend}: "
                               f"{type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("entry_point,fn,expected", ENTRY_POINTS)
def test_entry_point(world, entry_point, fn, expected):
    """Every torch.distributed entry point runs on the backend and gives every rank the closed-form result."""
    results = world.run(call_entry_point, entry_point, fn)
    for rank, (actual, want) in enumerate(zip(results, expected(world.world_size))):
        expect_same(actual, want, f"dist.{entry_point} on rank {rank}")
