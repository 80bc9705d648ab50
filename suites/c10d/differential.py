"""The differential suite's pieces: one generated collective call, its inputs, the
rank side that runs it and the oracle's expectation for it.

A ``Call`` says everything about one example, and its repr is a Python
expression that rebuilds it: it is what a failure prints and what
``DISTCONFORM_REPLAY`` (suites/differential.py) takes back. Both sides
build a rank's tensors with ``tensors_of(call, rank)``, from torch.Generators
seeded by (seed, rank, slot): the ranks to run the call, the pytest process to
feed backends/reference/semantics.py. Nothing but the Call crosses the wire.

Values are chosen so every reduction is exact in its own dtype whatever order a
backend combines ranks in (see ``_values``), so the comparison is bitwise
(AVG: within 2 ulp, it divides).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from suites import collectives, values
from suites import differential as runner
from suites.collectives import Args

# The operations are the collectives of suites/collectives.py (one table, read
# when a call is made): an entry added there is drawn here too.
SHAPE_CLASSES = ("1d", "scalar", "2d", "empty")  # the need's shape= value, as in values.SHAPES
LAYOUTS = ("contiguous", "non_contiguous")
GROUP_KEY = "differential-group"


def operations() -> list[str]:
    return collectives.names()


def splits_of(operation: str) -> tuple:
    """The split kinds drawn for ``operation`` ((None,) when it takes no split sizes)."""
    return collectives.get(operation).splits or (None,)

# floats: m * 2**e with |m| <= 7 (fewer in worlds over 18 ranks) and e in
# [EMIN, 1]: every partial sum is exact in the dtype (bfloat16 is the tightest),
# yet float64's 2**-30 steps are lost in float32 and float32's 2**-12 steps in a
# 16-bit type. Float products are of +-2**-1 .. +-2**1, integer products of 1, 2,
# -1, integer sums bounded by the dtype's range over the world size: nothing
# overflows, whatever order a backend combines ranks in.
_FLOAT_EMIN = {"float64": -30, "float32": -12, "float16": -2, "bfloat16": 0}
_INT_BITS = {"int32": 31, "int64": 63}
_SENTINEL = {"bool": True, "uint8": 251}


@dataclass(frozen=True)
class Call:
    """One collective call on a world; its repr rebuilds it (suites/differential.py ``parse_example``).

    shape: what one rank contributes per destination / per list entry (the
      in-place tensor for all_reduce, reduce, broadcast; the single-form
      tensors are world (group) size such chunks concatenated on dim 0).
    splits: all_to_all_single with uneven splits only: splits[i][j] rows go
      from group rank i to group rank j (shape[0] is then unused: 0).
    root, group: global ranks; group None is the default (world) group.
    """

    operation: str
    op: str | None
    dtype: str
    shape: tuple
    layout: str = "contiguous"
    root: int | None = None
    group: tuple | None = None
    splits: tuple | None = None
    seed: int = 0
    world_size: int = 2
    backend: str = "gloo"

    # ------------------------------------------------------------ derived
    @property
    def entry(self) -> collectives.Collective:
        return collectives.get(self.operation)

    @property
    def collective(self) -> str:
        return self.entry.family

    @property
    def form(self) -> str | None:
        return self.entry.form

    @property
    def split(self) -> str | None:
        if not self.entry.splits:
            return None
        return "uneven" if self.splits is not None else "even"

    @property
    def members(self) -> tuple:
        return tuple(range(self.world_size)) if self.group is None else self.group

    @property
    def shape_class(self) -> str:
        return shape_class(self.shape, self.splits)

    def need(self) -> dict:
        """The capability requirements of this call, in the suites' vocabulary."""
        return need_of(self.operation, self.op, self.dtype, self.shape_class, self.layout,
                       self.group is not None, self.split)

    def replace(self, **changes) -> "Call":
        return dataclasses.replace(self, **changes)

    def replay_command(self, plugins=()) -> str:
        """The shell command that runs exactly this call again (``plugins``: the run's --backend-plugin)."""
        return runner.replay_command(self, "suites/c10d/test_differential.py", self.backend, self.world_size, plugins)


def shape_class(shape: tuple, splits: tuple | None = None) -> str:
    if splits is not None:  # all_to_all_single, uneven: what moves is splits x shape[1:]
        rest = 1
        for dim in shape[1:]:
            rest *= dim
        return "empty" if rest == 0 or not any(map(any, splits)) else ("1d" if len(shape) == 1 else "2d")
    if len(shape) == 0:
        return "scalar"
    numel = 1
    for dim in shape:
        numel *= dim
    return "empty" if numel == 0 else ("1d" if len(shape) == 1 else "2d")


def need_of(operation: str, op, dtype: str, shape_cls: str, layout: str, subgroup: bool,
            split: str | None = None) -> dict:
    need = {**collectives.get(operation).need(), "dtype": dtype, "layout": layout, "shape": shape_cls}
    if op is not None:
        need["op"] = op
    if split is not None:
        need["split"] = split
    if subgroup:
        need["feature"] = "subgroups"
    return need


def ops_for(operation: str, dtype: str) -> tuple:
    return values.OPS_BY_KIND[values.kind_of(dtype)] if collectives.get(operation).reduces else (None,)


# ------------------------------------------------------------- inputs
def _generator(call: Call, rank: int, slot: int) -> torch.Generator:
    return torch.Generator().manual_seed((call.seed * 1_000_003 + rank * 10_007 + slot) % (2**63))


def _values(call: Call, shape: tuple, rank: int, slot: int, *, garbage: bool = False) -> torch.Tensor:
    """Rank ``rank``'s tensor number ``slot`` of this call (``garbage``: an output's initial fill)."""
    g = _generator(call, rank, slot + (1 << 20 if garbage else 0))
    dtype, kind = call.dtype, values.kind_of(call.dtype)
    op = None if garbage else call.op
    n = call.world_size
    if kind == "bool":
        return torch.randint(0, 2, shape, generator=g).bool()
    if kind == "float":
        if op == "product":  # +-2**-1 .. +-2**1 (+-1 only in worlds where 2**n overflows float16)
            sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
            spread = 1 if n <= 15 else 0
            exponent = torch.randint(-spread, spread + 1, shape, generator=g)
            wide = sign * torch.pow(2.0, exponent.double())
        elif op is not None:  # sum, avg, min, max
            m_max = max(1, min(7, 127 // n))  # n * 2 * m_max <= 256: sums stay exact in bfloat16
            m = torch.randint(-m_max, m_max + 1, shape, generator=g).double()
            exponent = torch.randint(_FLOAT_EMIN[dtype], 2, shape, generator=g)
            wide = m * torch.pow(2.0, exponent.double())
        else:  # data movement: any finite value
            wide = torch.randn(shape, generator=g, dtype=torch.float64) * 2.0 ** float(
                torch.randint(-4, 5, (), generator=g))
        return wide.to(values.DTYPES[dtype])
    if op == "product":  # 1, 2 (while 2**n fits), -1 (signed)
        fits = n < (8 if dtype == "uint8" else _INT_BITS[dtype])
        choices = torch.tensor([1] + [2] * fits + [-1] * (dtype != "uint8"))
        return choices[torch.randint(0, len(choices), shape, generator=g)].to(values.DTYPES[dtype])
    if op == "sum":  # as wide as the dtype allows without overflow over n ranks
        if dtype == "uint8":
            return torch.randint(0, 255 // n + 1, shape, generator=g, dtype=torch.uint8)
        bound = (2 ** _INT_BITS[dtype] - 1) // n
        return torch.randint(-bound, bound, shape, generator=g, dtype=values.DTYPES[dtype])
    # min, max, bitwise, data movement: the full range
    if dtype == "uint8":
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    bits = _INT_BITS[dtype]
    return torch.randint(-(2**bits), 2**bits - 1, shape, generator=g, dtype=values.DTYPES[dtype])


def _rows(shape: tuple, rows: int) -> tuple:
    return (rows,) + tuple(shape[1:])


@dataclass
class RankTensors:
    """What one rank passes to the call (contiguous data; the rank lays it out)."""

    inputs: list  # tensors the call reads (for in-place calls: the tensor itself)
    outputs: list  # initial contents of the tensors the call writes (out-of-place calls)


def chunk_shapes(call: Call, sending: bool, g: int) -> list:
    """Shapes of group rank ``g``'s chunks, one per group rank (to them if ``sending``, else from them)."""
    n = len(call.members)
    if call.splits is None:
        return [call.shape] * n
    return [_rows(call.shape, call.splits[g][j] if sending else call.splits[j][g]) for j in range(n)]


def tensors_of(call: Call, rank: int) -> RankTensors:
    """Rank ``rank``'s inputs and initial outputs, laid out as the table says; the same on both sides."""
    entry = call.entry
    data = lambda slot, shp=call.shape: _values(call, shp, rank, slot)  # noqa: E731
    junk = lambda slot, shp=call.shape: _values(call, shp, rank, slot, garbage=True)  # noqa: E731
    if rank not in call.members:
        return RankTensors([data(0)], [])
    g, is_root = call.members.index(rank), rank == call.root
    ins: list = []
    if entry.inputs.passed_by(is_root):
        shapes = chunk_shapes(call, True, g)[:entry.inputs.count(len(call.members))]
        ins = collectives.pack(entry.inputs, [data(j, shp) for j, shp in enumerate(shapes)])
    outs: list = []
    if entry.outputs is not None and entry.outputs.passed_by(is_root):
        shapes = chunk_shapes(call, False, g)[:entry.outputs.count(len(call.members))]
        if entry.outputs.packing == "tensor":  # one fill of the whole output tensor
            outs = [junk(0, _rows(call.shape, sum(shp[0] for shp in shapes)) if shapes[0] else call.shape)]
        else:
            outs = [junk(i, shp) for i, shp in enumerate(shapes)]
    return RankTensors(ins, outs)


def sentinel(dtype: str):
    return _SENTINEL.get(dtype, -5)


def lay_out(data: torch.Tensor, layout: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(tensor to pass, its buffer): a copy of ``data``, strided if asked.

    Strided: every other element along the last dimension (dim 0 for 1-D) of a
    buffer twice as wide whose other elements hold a sentinel.
    """
    if layout == "contiguous" or data.dim() == 0:
        tensor = data.clone().to(device)
        return tensor, tensor
    buffer = torch.full(data.shape[:-1] + (2 * data.shape[-1],), sentinel(str(data.dtype)[6:]),
                        dtype=data.dtype, device=device)
    view = buffer[..., ::2]
    view.copy_(data)
    return view, buffer


def outside_view(buffer: torch.Tensor, layout: str) -> torch.Tensor | None:
    if layout == "contiguous" or buffer.dim() == 0:
        return None
    return buffer[..., 1::2]


# --------------------------------------------------------- the oracle
@dataclass
class Expected:
    """Per rank: (what, tensor or None = unspecified) for each tensor the rank returns."""

    per_rank: list  # list of list of (str, Tensor | None)
    exact: bool


def expected_of(call: Call) -> Expected:
    """What every rank must hold afterwards: the table's oracle (backends/reference/semantics.py)."""
    entry = call.entry
    ranks = range(call.world_size)
    given = [tensors_of(call, r) for r in ranks]
    members = call.members
    root_g = members.index(call.root) if call.root is not None else None
    ins = [given[r].inputs for r in members]  # by group rank
    chunks = [collectives.unpack(entry.inputs, ins[g], [s[0] if s else 0 for s in chunk_shapes(call, True, g)])
              for g in range(len(members))]
    out = entry.oracle(chunks, call.op, root_g)
    in_name, out_name = entry.labels
    results: dict[int, list] = {}
    for g, r in enumerate(members):
        if entry.in_place:
            results[r] = [(in_name, out[g][0])]
            continue
        got = out[g]
        if entry.outputs.chunks == collectives.ONE_CHUNK:
            checked = [(out_name, got[0])]
        elif not got or entry.outputs.packing == "list":
            checked = [(f"{out_name}[{i}]", t) for i, t in enumerate(got)]
        else:
            checked = [(out_name, torch.cat(got) if call.shape else torch.stack(got))]
        if entry.inputs.packing == "list" and entry.inputs.chunks == collectives.PER_RANK:
            checked += [(f"{in_name}[{j}] (unchanged)", t) for j, t in enumerate(ins[g])]
        else:
            checked += [(f"{in_name} (unchanged)", t) for t in ins[g]]
        results[r] = checked
    per_rank = []
    for r in ranks:
        if r in results:
            per_rank.append(results[r])
        else:  # not in the group: did nothing, holds its own input
            per_rank.append([("tensor (non-member, untouched)", given[r].inputs[0])])
    return Expected(per_rank, exact=call.op != "avg")


# ---------------------------------------------------------- rank side
def _group(call: Call):
    """The call's process group (None: the default group), made once per world.

    new_group is collective over the whole world: every rank runs the same
    calls in the same order, so every rank creates the same groups in the
    same order, and World.reset() clears the cache on every rank.
    """
    import torch.distributed as dist

    from fixtures.rank import ctx

    if call.group is None:
        return None
    key = (GROUP_KEY, tuple(sorted(call.group)))
    if key not in ctx.scratch:
        ctx.scratch[key] = dist.new_group(ranks=list(key[1]))
    return ctx.scratch[key]


def run_on_rank(call: Call) -> dict:
    """Run ``call`` on this rank; return every tensor it checks, as CPU tensors.

    {"tensors": [...] in the order of expected_of's entries for this rank,
     "outside": [...] the buffer elements outside every strided view}
    """

    from fixtures.rank import ctx

    assert ctx.world_size == call.world_size, f"call for world size {call.world_size} on {ctx.world_size}"
    group = _group(call)
    rank, device, layout = ctx.rank, ctx.device, call.layout
    given = tensors_of(call, rank)
    ins = [lay_out(t, layout, device) for t in given.inputs]
    outs = [lay_out(t, layout, device) for t in given.outputs]
    i, o = [v for v, _ in ins], [v for v, _ in outs]
    if rank not in call.members:
        checked = i[:1]
    else:
        entry = call.entry
        g, n = call.members.index(rank), len(call.members)
        entry.issue(Args(i, o, op=values.reduce_op(call.op) if call.op is not None else None, root=call.root,
                         group=group, input_splits=list(call.splits[g]) if call.splits else None,
                         output_splits=[call.splits[s][g] for s in range(n)] if call.splits else None))
        checked = i if entry.in_place else o + i
    outside = [outside_view(b, layout) for _, b in ins + outs]
    return {"tensors": [t.cpu() for t in checked], "outside": [t.cpu() for t in outside if t is not None]}
