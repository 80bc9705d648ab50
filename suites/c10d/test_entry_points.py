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
from typing import Callable

import pytest
import torch
import torch.distributed as dist

from backends.reference import semantics
from fixtures.rank import ctx
from suites import collectives, compat, values
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


# ------------------------------------------------- rank side: one per entry point
# Each returns this rank's result; EXPECTED below gives it in closed form.
def _all_reduce():
    t = mine()
    dist.all_reduce(t)
    return t


def _all_reduce_async():
    t = mine()
    dist.all_reduce(t, async_op=True).wait()
    return t


def _broadcast():
    t = mine()
    dist.broadcast(t, src=ctx.world_size - 1)
    return t


def _reduce():
    t = mine()
    dist.reduce(t, dst=ctx.world_size - 1)
    return t if ctx.rank == ctx.world_size - 1 else None


def _all_gather():
    out = [zeros() for _ in range(ctx.world_size)]
    dist.all_gather(out, mine())
    return out


def _all_gather_into_tensor():
    out = zeros(NUMEL * ctx.world_size)
    dist.all_gather_into_tensor(out, mine())
    return out


def _all_gather_single():
    out = zeros(NUMEL * ctx.world_size)
    compat.all_gather_single(out, mine())
    return out


def _gather():
    root = ctx.world_size - 1
    out = [zeros() for _ in range(ctx.world_size)] if ctx.rank == root else None
    dist.gather(mine(), out, dst=root)
    return out


def _scatter():
    root = ctx.world_size - 1
    inputs = [x(100 + i).to(ctx.device) for i in range(ctx.world_size)] if ctx.rank == root else None
    out = zeros()
    dist.scatter(out, inputs, src=root)
    return out


def _reduce_scatter():
    out = zeros()
    dist.reduce_scatter(out, [mine(salt=10 * i) for i in range(ctx.world_size)])
    return out


def _reduce_scatter_tensor():
    out = zeros()
    dist.reduce_scatter_tensor(out, mine(numel=NUMEL * ctx.world_size))
    return out


def _reduce_scatter_single():
    out = zeros()
    compat.reduce_scatter_single(out, mine(numel=NUMEL * ctx.world_size))
    return out


def _all_to_all():
    out = [zeros() for _ in range(ctx.world_size)]
    dist.all_to_all(out, [mine(salt=10 * j) for j in range(ctx.world_size)])
    return out


def _all_to_all_single():
    out = zeros(2 * ctx.world_size)
    dist.all_to_all_single(out, mine(numel=2 * ctx.world_size))
    return out


def _barrier():
    dist.barrier()
    return None


def _monitored_barrier():
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    return None


def _all_reduce_coalesced():
    tensors = [mine(), mine(salt=7, numel=3)]
    dist.all_reduce_coalesced(tensors)
    return tensors


def _all_gather_coalesced():
    out = [[zeros(), zeros(3)] for _ in range(ctx.world_size)]
    dist.all_gather_coalesced(out, [mine(), mine(salt=7, numel=3)])
    return out


def _coalescing_manager_all_reduce():
    tensors = [mine(), mine(salt=7, numel=3)]
    with dist._coalescing_manager():
        for t in tensors:
            dist.all_reduce(t)
    return tensors


def _coalescing_manager_all_gather_into_tensor():
    outs = [zeros(NUMEL * ctx.world_size), zeros(3 * ctx.world_size)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(outs[0], mine())
        dist.all_gather_into_tensor(outs[1], mine(salt=7, numel=3))
    return outs


def _coalescing_manager_reduce_scatter_tensor():
    outs = [zeros(), zeros(3)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(outs[0], mine(numel=NUMEL * ctx.world_size))
        dist.reduce_scatter_tensor(outs[1], mine(salt=7, numel=3 * ctx.world_size))
    return outs


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
def _sum(tensors):
    return semantics.reduce_tensors("sum", tensors)


def _expected(name: str, n: int) -> list:
    """Every rank's result of entry point ``name`` at world size ``n`` (None: nothing to check)."""
    last = n - 1
    xs = [x(r) for r in range(n)]
    if name in ("all_reduce", "all_reduce_async"):
        return semantics.all_reduce(xs, "sum")
    if name == "broadcast":
        return semantics.broadcast(xs, last)
    if name == "reduce":
        return [None] * last + [semantics.reduce(xs, "sum", last)]
    if name == "all_gather":
        return semantics.all_gather(xs)
    if name in ("all_gather_into_tensor", "all_gather_single"):
        return semantics.all_gather_into_tensor(xs)
    if name == "gather":
        return [None] * last + [semantics.gather(xs, last)]
    if name == "scatter":
        return semantics.scatter([x(100 + i) for i in range(n)], n)
    if name == "reduce_scatter":
        return semantics.reduce_scatter([[x(r, 10 * i) for i in range(n)] for r in range(n)], "sum")
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return semantics.reduce_scatter_tensor([x(r, numel=NUMEL * n) for r in range(n)], "sum")
    if name == "all_to_all":
        return semantics.all_to_all([[x(r, 10 * j) for j in range(n)] for r in range(n)])
    if name == "all_to_all_single":
        return semantics.all_to_all_single([x(r, numel=2 * n) for r in range(n)], [None] * n)
    if name in ("barrier", "monitored_barrier"):
        return [None] * n
    if name in ("all_reduce_coalesced", "coalescing_manager_all_reduce"):
        return semantics.all_reduce_coalesced([[x(r), x(r, 7, 3)] for r in range(n)], "sum")
    if name == "all_gather_coalesced":
        return semantics.all_gather_coalesced([[x(r), x(r, 7, 3)] for r in range(n)])
    if name == "coalescing_manager_all_gather_into_tensor":
        return [list(pair) for pair in zip(semantics.all_gather_into_tensor(xs),
                                           semantics.all_gather_into_tensor([x(r, 7, 3) for r in range(n)]))]
    if name == "coalescing_manager_reduce_scatter_tensor":
        first = semantics.reduce_scatter_tensor([x(r, numel=NUMEL * n) for r in range(n)], "sum")
        second = semantics.reduce_scatter_tensor([x(r, 7, 3 * n) for r in range(n)], "sum")
        return [[a, b] for a, b in zip(first, second)]
    if name == "all_gather_object":
        return [[obj(r) for r in range(n)]] * n
    if name == "broadcast_object_list":
        return [[obj(last), last]] * n
    if name == "gather_object":
        return [None] * last + [[obj(r) for r in range(n)]]
    if name == "scatter_object_list":
        return [obj(100 + i) for i in range(n)]
    if name == "send_recv_object_list":
        return [None] * last + [[obj(0), "tail"]]
    if name == "send_recv":
        return [None] * last + [x(0)]
    if name in ("isend_irecv", "batch_isend_irecv"):
        return [x((r - 1) % n) for r in range(n)]
    raise KeyError(name)


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


# ------------------------------------------------------------------ the table
def _entry(name: str, fn: Callable, of: str | None = None, **needs) -> object:
    """The case of entry point ``name``. ``of``: the collective of suites/collectives.py it calls (default: ``name``
    when the table has it); the table states that collective's requirements (family and form)."""
    of = of or (name if name in collectives.TABLE else None)
    if of is not None:
        needs = {**collectives.need(of), **needs}
    return pytest.param(name, fn, id=name, marks=pytest.mark.needs(entry_point=name, **needs))


ENTRY_POINTS = [
    _entry("all_reduce", _all_reduce),
    _entry("all_reduce_async", _all_reduce_async, of="all_reduce"),
    _entry("broadcast", _broadcast),
    _entry("reduce", _reduce),
    _entry("all_gather", _all_gather),
    _entry("all_gather_into_tensor", _all_gather_into_tensor),
    _entry("all_gather_single", _all_gather_single, of="all_gather_into_tensor"),
    _entry("gather", _gather),
    _entry("scatter", _scatter),
    _entry("reduce_scatter", _reduce_scatter),
    _entry("reduce_scatter_tensor", _reduce_scatter_tensor),
    _entry("reduce_scatter_single", _reduce_scatter_single, of="reduce_scatter_tensor"),
    _entry("all_to_all", _all_to_all),
    _entry("all_to_all_single", _all_to_all_single),
    _entry("barrier", _barrier, collective="barrier"),
    _entry("monitored_barrier", _monitored_barrier, feature="monitored_barrier"),
    _entry("all_reduce_coalesced", _all_reduce_coalesced, of="all_reduce", feature="coalescing"),
    _entry("all_gather_coalesced", _all_gather_coalesced, of="all_gather", feature="coalescing"),
    _entry("coalescing_manager_all_reduce", _coalescing_manager_all_reduce, of="all_reduce", feature="coalescing"),
    _entry("coalescing_manager_all_gather_into_tensor", _coalescing_manager_all_gather_into_tensor,
           of="all_gather_into_tensor", feature="coalescing"),
    _entry("coalescing_manager_reduce_scatter_tensor", _coalescing_manager_reduce_scatter_tensor,
           of="reduce_scatter_tensor", feature="coalescing"),
    _entry("all_gather_object", _all_gather_object, feature="object_collectives"),
    _entry("broadcast_object_list", _broadcast_object_list, feature="object_collectives"),
    _entry("gather_object", _gather_object, feature="object_collectives"),
    _entry("scatter_object_list", _scatter_object_list, feature="object_collectives"),
    _entry("send_recv_object_list", _send_recv_object_list, feature="object_collectives"),
    _entry("send_recv", _send_recv, collective="send_recv"),
    _entry("isend_irecv", _isend_irecv, collective="send_recv"),
    _entry("batch_isend_irecv", _batch_isend_irecv, collective="batch_isend_irecv"),
]


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
@pytest.mark.parametrize("entry_point,fn", ENTRY_POINTS)
def test_entry_point(world, entry_point, fn):
    """Every torch.distributed entry point runs on the backend and gives every rank the closed-form result."""
    results = world.run(call_entry_point, entry_point, fn)
    for rank, (actual, expected) in enumerate(zip(results, _expected(entry_point, world.world_size))):
        expect_same(actual, expected, f"dist.{entry_point} on rank {rank}")
