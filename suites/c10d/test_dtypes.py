"""Contract: the dtypes of today's models, beyond the 2020 set.

* complex64/complex128: all_reduce SUM and AVG are exact per component;
  MIN and MAX (complex numbers have no order) raise a clear error when the
  group itself is asked (dist.all_reduce refuses them before the backend
  sees them, and refuses PRODUCT too: it hands backends the real view of a
  complex tensor, which is wrong for a product), and leave the group usable;
  the group's own allreduce (what a backend sees when torch does not take
  the real view first) does complex arithmetic: SUM and AVG exact, PRODUCT the
  complex product or a clear refusal, never the product of the real view;
  broadcast, all_gather and send/recv move them bit for bit.
* float8_e4m3fn, float8_e5m2 (no arithmetic on CPU): every data-moving
  collective and send/recv carries their bytes unchanged.
* int8, int16, uint16, uint32, uint64: data-moving collectives bit for bit
  (uint64 values above 2**63, so a trip through int64 or double shows), and
  all_reduce with every op torch has a CPU kernel for on that dtype
  (int8/int16: all ops; uint16/32/64: PRODUCT and the bitwise ops).
* PREMUL_SUM (``dist._make_nccl_premul_sum(factor)``): every input scaled by
  the factor, then summed; a backend without it declares the gap.
* sparse COO all_reduce SUM: indices merged, values at equal indices added;
  complex ones too, through the group's own allreduce (dist.all_reduce takes
  a real-view copy of a complex tensor, which for a sparse one loses the sum
  on every backend: torch 2.13).

Bit patterns are compared (``view(torch.uint8)``), because torch has no
equality kernel for float8 and the unsigned types.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from backends.reference import semantics
from fixtures.rank import ctx
from suites import collectives, values
from suites.checks import expect_tensor

NUMEL = 7
NARROW_INT = ("int8", "int16", "uint16", "uint32", "uint64")
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
COMPLEX = ("complex64", "complex128")
SEND_RECV = "send_recv"  # p2p: moved like the collectives, not one of them


def moving(group: str) -> list:
    """The operations that move dtype ``group`` (suites/collectives.py MOVED_DTYPES): the table's collectives
    that carry it, each stating its family and form (backends/spec.py REQUIREMENT_KEYS), and send/recv."""
    params = [pytest.param(c.name, id=c.name, marks=pytest.mark.needs(**c.need()))
              for c in collectives.with_dtypes_moved(group)]
    return params + [pytest.param(SEND_RECV, id=SEND_RECV,  # to a peer: torch refuses a send to the own rank
                                  marks=[pytest.mark.needs(collective=SEND_RECV), pytest.mark.min_world_size(2)])]


# the reduce ops torch 2.13 has CPU kernels for on each narrow integer dtype (add/max/min on
# uint16/32/64: '"add_stub" not implemented for 'UInt16'')
NARROW_OPS = {
    "int8": ("sum", "product", "min", "max", "band", "bor", "bxor"),
    "int16": ("sum", "product", "min", "max", "band", "bor", "bxor"),
    "uint16": ("product", "band", "bor", "bxor"),
    "uint32": ("product", "band", "bor", "bxor"),
    "uint64": ("product", "band", "bor", "bxor"),
}


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def bits_of(name: str) -> int:
    return torch.empty((), dtype=dtype_of(name)).element_size() * 8


def _from_ints(ints: list[int], name: str) -> torch.Tensor:
    """Python ints taken modulo 2**bits, as the dtype (negative for a signed type's top half)."""
    bits = bits_of(name)
    wrapped = [v % (1 << bits) for v in ints]
    if not name.startswith("uint"):
        wrapped = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in wrapped]
    return torch.tensor(wrapped, dtype=dtype_of(name))


def payload(rank: int, name: str, salt: int = 0, numel: int = NUMEL) -> torch.Tensor:
    """What ``rank`` moves: says who sent it, and uses the dtype's top bits (or its float range)."""
    if name in FLOAT8:
        floats = [(k - 3 + salt) * 0.5 * (rank + 1) + (k % 3) * 0.125 for k in range(numel)]
        return torch.tensor(floats).to(dtype_of(name))
    if name in COMPLEX:
        real = values.rank_payload(rank, numel, "float64", salt) + 2.0**-30
        return torch.complex(real, -real / 4).to(dtype_of(name))
    bits = bits_of(name)
    return _from_ints([(1 << (bits - 1)) | ((rank + 1) << (bits - 5)) | (k + 8 * salt) for k in range(numel)], name)


def reduce_input(rank: int, name: str, op: str) -> torch.Tensor:
    """Rank ``rank``'s all_reduce input: every result exact (integers wrap like any same-width arithmetic)."""
    bits = bits_of(name)
    ints = []
    for i in range(NUMEL):
        if op in ("band", "bor", "bxor"):  # high bits differ per rank, the top bit included
            ints.append((((i * 37 + rank * 101) ^ (rank << (i % 5))) & 0xFF) | ((rank + i) % 4 << (bits - 2)))
        elif op == "product":  # element 0 of rank 0 is 2**(bits-2): the product wraps where int64 would not
            ints.append(1 << (bits - 2) if (i, rank) == (0, 0) else (i + rank) % 3 + 1)
        elif op in ("min", "max"):
            ints.append((i * 3 + rank * 5) % 11 - 5)
        else:
            ints.append(i % 7 + 1 + rank * 3)
    return _from_ints(ints, name)


def expect_bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Same dtype, shape and bytes (torch has no == for float8 and the unsigned types)."""
    assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    got, want = actual.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)
    if not torch.equal(got, want):
        width = expected.element_size()
        first = int((got != want).nonzero()[0]) // width
        raise AssertionError(f"{what}: element {first} has bytes {got[first * width:(first + 1) * width].tolist()}, "
                             f"expected {want[first * width:(first + 1) * width].tolist()} "
                             f"({expected.reshape(-1)[first].to(torch.float64 if not expected.is_complex() else expected.dtype).item()!r})")


def packed(result):
    """A tensor (or list of them) as (dtype name, shape, bytes): torch cannot pickle float8 tensors."""
    if isinstance(result, list):
        return [packed(t) for t in result]
    if result is None:
        return None
    t = result.detach().cpu().contiguous()
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), t.view(torch.uint8).clone()


def unpacked(result):
    if isinstance(result, list):
        return [unpacked(t) for t in result]
    if result is None:
        return None
    name, shape, raw = result
    return raw.view(dtype_of(name)).reshape(shape)


# ---------------------------------------------------------------- rank side
def moved_chunks(entry: collectives.Collective, rank: int, name: str, n: int, root: int) -> list:
    """What ``rank`` passes to a data-moving collective: chunk j says who sent it for whom ([] if it passes none)."""
    if not entry.inputs.passed_by(rank == root):
        return []
    return [payload(rank, name, salt=j) for j in range(entry.inputs.count(n))]


def move(operation: str, name: str):
    """Run one data-moving operation; return this rank's result chunks, packed."""
    return packed(_send_recv(name) if operation == SEND_RECV else _move(collectives.get(operation), name))


def _move(entry: collectives.Collective, name: str) -> list:
    n, me, root = ctx.world_size, ctx.rank, ctx.world_size - 1
    chunks = [t.to(ctx.device) for t in moved_chunks(entry, me, name, n, root)]
    args = collectives.args_for(entry, chunks, lambda j: torch.zeros(NUMEL, dtype=dtype_of(name), device=ctx.device),
                                group_size=n, is_root=me == root, root=root)
    entry.issue(args)
    return [t.cpu() for t in collectives.result_chunks(entry, args, [NUMEL] * n)]


def _send_recv(name: str) -> list:
    me, root = ctx.rank, ctx.world_size - 1
    if me == 0:
        dist.send(payload(me, name).to(ctx.device), dst=root)
    elif me == root:
        out = torch.zeros(NUMEL, dtype=dtype_of(name), device=ctx.device)
        dist.recv(out, src=0)
        return [out.cpu()]
    return []


def expected_moved(operation: str, name: str, n: int) -> list:
    """Per rank: its result chunks (None: unspecified, []: none), from the table's oracle."""
    root = n - 1
    if operation == SEND_RECV:
        return [[]] * root + [[payload(0, name)]]
    entry = collectives.get(operation)
    return entry.oracle([moved_chunks(entry, r, name, n, root) for r in range(n)], None, root)


def check_moved(results, operation, name, n):
    for rank, (got, want) in enumerate(zip(unpacked(results), expected_moved(operation, name, n))):
        assert len(got) == len(want), f"{operation} of {name} on rank {rank}: {len(got)} results, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            if w is not None:
                expect_bits(g, w, f"{operation} of {name} on rank {rank} (entry {i})")


def all_reduce_narrow(name: str, op: str):
    tensor = reduce_input(ctx.rank, name, op).to(ctx.device)
    dist.all_reduce(tensor, op=values.reduce_op(op))
    return packed(tensor)


def complex_input(rank: int, name: str, op: str, numel: int = NUMEL) -> torch.Tensor:
    part = "float32" if name == "complex64" else "float64"
    real = values.rank_input(op, part, (numel,), rank)
    imag = values.rank_input(op, part, (numel,), (rank + 1) % 5)
    return torch.complex(real, -imag)


def all_reduce_complex(name: str, op: str):
    tensor = complex_input(ctx.rank, name, op).to(ctx.device)
    dist.all_reduce(tensor, op=values.reduce_op(op))
    return tensor.cpu()


def refused_then_usable(name: str, op: str):
    """The group's allreduce of complex tensors with an op they cannot take: the error, then a normal all_reduce.

    The group is called directly: dist.all_reduce would refuse before the backend is reached.
    """
    tensor = complex_input(ctx.rank, name, "sum").to(ctx.device)
    opts = dist.AllreduceOptions()
    opts.reduceOp = values.reduce_op(op)
    try:
        dist.group.WORLD.allreduce([tensor], opts).wait()
        error = None
    except (ValueError, RuntimeError, TypeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = torch.ones(3, device=ctx.device)
    dist.all_reduce(after)
    return error, after.cpu()


def group_all_reduce_complex(name: str, op: str):
    """The group's allreduce of a complex tensor: (error, None) or (None, the result)."""
    tensor = complex_input(ctx.rank, name, op).to(ctx.device)
    opts = dist.AllreduceOptions()
    opts.reduceOp = values.reduce_op(op)
    try:
        dist.group.WORLD.allreduce([tensor], opts).wait()
    except (ValueError, RuntimeError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}", None
    return None, tensor.cpu()


def reduced_chunks(entry: collectives.Collective, rank: int, n: int, make) -> list:
    """Rank ``rank``'s input chunks: ``make(numel)`` for all of them at once, cut into the chunks the entry takes."""
    count = entry.inputs.count(n)
    return list(make(NUMEL * count).chunk(count))


def _reduce(entry: collectives.Collective, chunks: list, dtype, op) -> list:
    """Run a reducing collective (to the last rank where rooted) over ``chunks``; this rank's result chunks."""
    n, root = ctx.world_size, ctx.world_size - 1
    args = collectives.args_for(entry, [t.to(ctx.device) for t in chunks],
                                lambda j: torch.zeros(NUMEL, dtype=dtype, device=ctx.device),
                                group_size=n, is_root=ctx.rank == root, op=op, root=root)
    entry.issue(args)
    return [t.cpu() for t in collectives.result_chunks(entry, args, [NUMEL] * n)]


def expected_reduced(entry: collectives.Collective, inputs: list, op: str) -> list:
    """Per rank: its result chunks (None: unspecified), from the table's oracle."""
    return entry.oracle(inputs, op, len(inputs) - 1)


def complex_reduced(collective: str, name: str, op: str):
    """A reducing collective of complex tensors (reduce: to the last rank): (error, None) or (None, result chunks).

    torch hands reduce and reduce_scatter to the backend as complex tensors (all_reduce, broadcast and
    all_gather get the real view instead)."""
    entry = collectives.get(collective)
    chunks = reduced_chunks(entry, ctx.rank, ctx.world_size, lambda numel: complex_input(ctx.rank, name, op, numel))
    try:
        return None, _reduce(entry, chunks, dtype_of(name), values.reduce_op(op))
    except (ValueError, RuntimeError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}", None


def premul_input(entry: collectives.Collective, rank: int, dtype: str, n: int) -> list:
    return reduced_chunks(entry, rank, n, lambda numel: values.rank_input("sum", dtype, (numel,), rank))


def premul_sum(collective: str, dtype: str, factor: float, factor_kind: str = "float"):
    entry = collectives.get(collective)
    # the factor as a Python float or as a 1-element tensor (both _make_nccl_premul_sum overloads); a tensor
    # factor has the data's dtype, as ProcessGroupNCCL reads it as one ('expected scalar type Double but found
    # Float' for a float32 factor of float64 data, torch 2.11)
    factor_arg = factor if factor_kind == "float" else torch.tensor([factor], dtype=values.DTYPES[dtype], device=ctx.device)
    op = dist._make_nccl_premul_sum(factor_arg)
    return _reduce(entry, premul_input(entry, ctx.rank, dtype, ctx.world_size), values.DTYPES[dtype], op)


SPARSE_SHAPES = {"1d": (10,), "rows": (6, 3)}  # rows: sparse_dim 1 with a dense row, like embedding gradients


def sparse_input(rank: int, shape_name: str, dtype: str = "float32") -> torch.Tensor:
    """Rank-specific indices (some shared with other ranks, some not, unsorted, one repeated).

    Complex values get an imaginary part of their own (k - rank), so a real-only path shows."""
    shape = SPARSE_SHAPES[shape_name]
    rows = [rank % shape[0], (rank * 3 + 1) % shape[0], 0, rank % shape[0]]
    dense = shape[1:]
    kind = getattr(torch, dtype)
    vals = torch.stack([torch.full(dense, complex(rank * 10 + k + 1, k - rank) if kind.is_complex
                                   else float(rank * 10 + k + 1), dtype=kind) for k in range(len(rows))])
    return torch.sparse_coo_tensor(torch.tensor([rows]), vals, shape, check_invariants=True)


def sparse_all_reduce(shape_name: str):
    tensor = sparse_input(ctx.rank, shape_name).to(ctx.device)
    dist.all_reduce(tensor)
    return tensor.is_sparse, tensor.to_dense().cpu()


def group_sparse_all_reduce(shape_name: str, dtype: str):
    """The group's own allreduce of a complex COO tensor: (error, None) or (None, (is_sparse, dense result)).

    Not dist.all_reduce: for a complex tensor it hands the group torch.view_as_real(tensor), which for a
    sparse tensor is a copy, so the sum lands in the copy and every rank keeps its input, whatever the
    backend (measured on gloo, reference and native, torch 2.13)."""
    tensor = sparse_input(ctx.rank, shape_name, dtype).to(ctx.device)
    try:
        dist.group.WORLD.allreduce([tensor]).wait()
    except (ValueError, RuntimeError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}", None
    return None, (tensor.is_sparse, tensor.to_dense().cpu())


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("operation", moving(collectives.COMPLEX))
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_moves_bit_for_bit(world, dtype, operation):
    """broadcast, all_gather and send/recv move complex64/complex128 tensors bit for bit."""
    check_moved(world.run(move, operation, dtype), operation, dtype, world.world_size)


@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_all_reduce(world, dtype, op):
    """all_reduce SUM and AVG of complex tensors reduce real and imaginary parts exactly."""
    n = world.world_size
    expected = semantics.reduce_tensors(op, [complex_input(r, dtype, op) for r in range(n)])
    for rank, got in enumerate(world.run(all_reduce_complex, dtype, op)):
        expect_tensor(torch.view_as_real(got), torch.view_as_real(expected), f"complex all_reduce {op} on rank {rank}",
                      exact=op != "avg")


@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_all_reduce_unordered_op_raises(world, dtype, op, record_property):
    """The group's allreduce of complex tensors with MIN or MAX raises on every rank; the group stays usable."""
    for rank, (error, after) in enumerate(world.run(refused_then_usable, dtype, op)):
        assert error is not None, f"rank {rank}: complex all_reduce {op.upper()} returned instead of raising"
        expect_tensor(after, torch.full((3,), float(world.world_size)), f"rank {rank}: all_reduce after the refusal")
        record_property("finding", f"complex {op}: {error.splitlines()[0]}")


@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("op", ["sum", "avg", "product"])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_group_all_reduce(world, dtype, op, record_property):
    """The group's own allreduce of complex tensors is complex arithmetic (PRODUCT: the complex product or a refusal)."""
    n = world.world_size
    expected = semantics.reduce_tensors(op, [complex_input(r, dtype, op) for r in range(n)])
    for rank, (error, got) in enumerate(world.run(group_all_reduce_complex, dtype, op)):
        if error is not None and op == "product":
            record_property("finding", f"complex product refused: {error.splitlines()[0]}")
            continue
        assert error is None, f"rank {rank}: the group's complex all_reduce {op.upper()} raised {error}"
        expect_tensor(torch.view_as_real(got), torch.view_as_real(expected),
                      f"the group's complex all_reduce {op} on rank {rank}", exact=op != "avg")


@pytest.mark.parametrize("collective", [pytest.param(c.name, id=c.name, marks=pytest.mark.needs(**c.need()))
                                        for c in collectives.with_dtypes_reduced(collectives.COMPLEX)])
@pytest.mark.parametrize("op", ["sum", "product", "max"])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_reduce_and_reduce_scatter(world, dtype, op, collective, record_property):
    """reduce and reduce_scatter of complex tensors: SUM exact, PRODUCT complex or refused, MAX refused."""
    n, entry = world.world_size, collectives.get(collective)
    inputs = [reduced_chunks(entry, r, n, lambda numel, r=r: complex_input(r, dtype, op, numel)) for r in range(n)]
    expected = [None] * n if op == "max" else expected_reduced(entry, inputs, op)
    for rank, (error, got) in enumerate(world.run(complex_reduced, collective, dtype, op)):
        if op == "max":
            assert error is not None, f"rank {rank}: {collective} MAX of complex tensors returned instead of raising"
        elif error is not None and op == "product":
            record_property("finding", f"complex product refused: {error.splitlines()[0]}")
            continue
        else:
            assert error is None, f"rank {rank}: {collective} {op.upper()} of complex tensors raised {error}"
        if error is not None:
            record_property("finding", f"complex {op} refused: {error.splitlines()[0]}")
            continue
        for i, (g, want) in enumerate(zip(got, expected[rank])):
            if want is not None:
                expect_tensor(torch.view_as_real(g), torch.view_as_real(want),
                              f"{collective} {op} of {dtype} on rank {rank} (chunk {i})")


@pytest.mark.parametrize("operation", moving(collectives.FLOAT8))
@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_moves_bit_for_bit(world, dtype, operation):
    """Data-moving collectives and send/recv carry float8 (e4m3fn, e5m2) bytes unchanged."""
    check_moved(world.run(move, operation, dtype), operation, dtype, world.world_size)


@pytest.mark.parametrize("operation", moving(collectives.NARROW_INT))
@pytest.mark.parametrize("dtype", NARROW_INT)
def test_narrow_int_moves_bit_for_bit(world, dtype, operation):
    """Data-moving collectives and send/recv carry int8/int16/uint16/uint32/uint64 bit for bit (top bit set)."""
    check_moved(world.run(move, operation, dtype), operation, dtype, world.world_size)


@pytest.mark.needs(collective="all_reduce")
@pytest.mark.parametrize("dtype,op", [(d, o) for d in NARROW_INT for o in NARROW_OPS[d]],
                         ids=[f"{d}-{o}" for d in NARROW_INT for o in NARROW_OPS[d]])
def test_narrow_int_all_reduce(world, dtype, op):
    """all_reduce on int8/int16/uint16/uint32/uint64 is exact in the dtype's own width (wrapping, never saturating)."""
    n = world.world_size
    expected = semantics.reduce_tensors(op, [reduce_input(r, dtype, op) for r in range(n)])
    for rank, got in enumerate(unpacked(world.run(all_reduce_narrow, dtype, op))):
        expect_bits(got, expected, f"all_reduce {op} of {dtype} on rank {rank}")


@pytest.mark.needs(feature="premul_sum", op="premul_sum")
@pytest.mark.parametrize("factor_kind", ["float", "tensor"])
@pytest.mark.parametrize("collective", [pytest.param(c.name, id=c.bench_name, marks=pytest.mark.needs(**c.need()))
                                        for c in collectives.with_dtypes_reduced(collectives.PREMUL_SUM)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_premul_sum(world, collective, dtype, factor_kind):
    """PREMUL_SUM(factor) scales every rank's input by the factor, then sums (exact for a power-of-two factor)."""
    n, factor, entry = world.world_size, 0.25, collectives.get(collective)
    scaled = [[t * factor for t in premul_input(entry, r, dtype, n)] for r in range(n)]
    expected = expected_reduced(entry, scaled, "sum")
    for rank, got in enumerate(world.run(premul_sum, collective, dtype, factor, factor_kind)):
        for i, (g, want) in enumerate(zip(got, expected[rank])):
            if want is not None:
                expect_tensor(g, want, f"{collective} PREMUL_SUM({factor} as a {factor_kind}) {dtype} "
                                       f"on rank {rank} (chunk {i})")


@pytest.mark.needs(collective="all_reduce", feature="sparse")
@pytest.mark.parametrize("dtype", COMPLEX)
def test_sparse_complex_group_all_reduce_sum(world, dtype):
    """The group's own all_reduce SUM of complex sparse COO tensors adds complex values at equal indices."""
    n = world.world_size
    expected = semantics.sparse_all_reduce([sparse_input(r, "rows", dtype) for r in range(n)])[0].to_dense()
    for rank, (error, got) in enumerate(world.run(group_sparse_all_reduce, "rows", dtype)):
        assert error is None, f"rank {rank}: the group's sparse {dtype} all_reduce raised {error}"
        is_sparse, dense = got
        assert is_sparse, f"rank {rank}: the result is no longer a sparse tensor"
        expect_tensor(torch.view_as_real(dense), torch.view_as_real(expected),
                      f"the group's sparse {dtype} all_reduce on rank {rank}")


@pytest.mark.needs(collective="all_reduce", feature="sparse")
@pytest.mark.parametrize("shape", list(SPARSE_SHAPES))
def test_sparse_coo_all_reduce_sum(world, shape):
    """all_reduce SUM of sparse COO tensors merges indices and adds values at equal indices, on every rank."""
    n = world.world_size
    expected = semantics.sparse_all_reduce([sparse_input(r, shape) for r in range(n)])[0].to_dense()
    for rank, (is_sparse, dense) in enumerate(world.run(sparse_all_reduce, shape)):
        assert is_sparse, f"rank {rank}: the result is no longer a sparse tensor"
        expect_tensor(dense, expected, f"sparse all_reduce ({shape}) on rank {rank}")
