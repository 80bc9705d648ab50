"""One table of collectives: everything the suites and the benchmarks know about each one.

A ``Collective`` record says, for one c10d entry point (nccl-tests keeps one
record per collective, torchft's process_group_test one ``_COLLECTIVE_TO_FUNC``
table; this is both):

* ``name``: the torch.distributed function (``all_gather_into_tensor``), the
  differential suite's ``operation``;
* ``family`` and ``form``: the requirement keys its gaps are matched on
  (``collective="all_gather", form="single"``, backends/spec.py);
* ``inputs`` / ``outputs``: the buffer layout on a rank: one chunk or one per
  group rank, as a list or one flat tensor (chunks concatenated on dim 0),
  passed by every rank or by the root only; outputs ``IN_PLACE``: the call
  writes its input;
* ``reduces``, ``flow``: whether it takes a reduce op; whether data goes
  between all ranks, out of the root or into the root (rooted);
* ``call`` and ``entry_points``: how a rank calls it, from an ``Args``, and
  the torch.distributed functions of that signature (torch 2.13's
  ``all_gather_single`` / ``reduce_scatter_single`` first, their older
  names after); ``issue(args, entry_point=None)`` calls through one of them;
* ``oracle``: what every rank must hold afterwards, computed with
  backends/reference/semantics.py over every rank's input chunks;
* ``bus_factor``: nccl-tests' busbw / algbw at n ranks;
* ``async_entry_point``, ``coalesced``: the other ways it is issued (async_op=True;
  its ``*_coalesced`` function, c10d's ``_coalescing_manager``);
* ``dtypes_moved`` / ``dtypes_reduced``: the dtype groups (FLOAT8, NARROW_INT,
  COMPLEX; COMPLEX, PREMUL_SUM) it carries bit for bit or reduces exactly;
* ``functional``: its form in torch.distributed._functional_collectives, its
  differentiable form and its adjoint (the collective its backward is).

A collective has one name, the table's key (torch's function name where it
has one). The benchmark shows nccl-tests' names (``bench_name``: all_gather
is the one-tensor form); the command line turns them into records once.

Readers: suites/c10d/differential.py (generated calls and their expectation),
suites/c10d/test_timeouts.py (a collective one rank skips),
suites/c10d/test_entry_points.py (every entry point, coalesced form and
async call), test_dtypes.py (what moves and what reduces which dtypes),
test_coalescing.py (the coalescing manager with a device),
suites/parallel/test_functional.py (functional forms in flight and their
backward), the requirements (``need``) of those cases and test_bad_input.py's,
suites/stress/rank_bench.py and suites/stress/metrics.py (the benchmark's
buffers, check and columns), suites/stress/collectives.py (its options).
tests/test_collectives_table.py fails when an entry is not run by the dtype,
entry-point and differential clauses (and the coalescing and functional ones
where it has those forms). Adding a collective is adding one entry (its fields by keyword) to
``TABLE`` below (tests/harness_cases/extra_collective.py does it from a
plugin); readers look the table up when they run or when pytest collects
them (a --backend-plugin is imported before), never from a copy of their own.

The table lives in ``suites/`` beside values.py and compat.py because it is
knowledge of the contract's calls, shared by the contract suites and the
benchmarks (both under suites/); backends/ holds what backends *are*, and
the reference backend must not depend on the test side. Importing this
module does not import torch (the benchmark's --help stays instant): the
record functions import it when they run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

from backends import spec as requirements

# ---------------------------------------------------------------- layout
PER_RANK = "per_rank"  # one chunk per group rank (chunk j: to / from group rank j)
ONE_CHUNK = "one"


@dataclass(frozen=True)
class Slots:
    """What one side (inputs or outputs) of a call is on a rank."""

    chunks: str  # ONE_CHUNK or PER_RANK
    packing: str  # "list": a Python list of tensors, "tensor": one tensor (chunks concatenated on dim 0)
    root_only: bool = False  # only the root passes it (gather's gather_list, scatter's scatter_list)

    def count(self, group_size: int) -> int:
        return group_size if self.chunks == PER_RANK else 1

    def passed_by(self, is_root: bool) -> bool:
        return is_root or not self.root_only


ONE = Slots(ONE_CHUNK, "tensor")
LIST = Slots(PER_RANK, "list")
FLAT = Slots(PER_RANK, "tensor")
ROOT_LIST = Slots(PER_RANK, "list", root_only=True)
IN_PLACE = None  # as ``outputs``: the call writes its input tensor

# flows of data
ALL_TO_ALL = "all"  # every rank needs every other's data
FROM_ROOT = "from_root"  # broadcast, scatter: every rank waits for the root
TO_ROOT = "to_root"  # reduce, gather: only the root waits for everyone


@dataclass
class Args:
    """What a rank passes to ``Collective.issue``."""

    inputs: list  # the rank's input tensors as ``Collective.inputs`` lays them out ([] where it passes none)
    outputs: list  # likewise for ``outputs`` ([] for IN_PLACE)
    op: object = None  # a torch.distributed.ReduceOp, for reducing collectives
    root: int | None = None  # global rank of the root, for rooted ones
    group: object = None  # None: the default group
    async_op: bool = False
    input_splits: list | None = None  # all_to_all_single: rows to each group rank (None: even)
    output_splits: list | None = None  # rows from each group rank


Oracle = Callable[[Sequence[Sequence[object]], "str | None", "int | None"], list]

# dtype groups of suites/c10d/test_dtypes.py's per-collective clauses
FLOAT8 = "float8"  # float8_e4m3fn, float8_e5m2: no arithmetic on CPU, so moved only
NARROW_INT = "narrow_int"  # int8, int16, uint16, uint32, uint64
COMPLEX = "complex"  # complex64, complex128
PREMUL_SUM = "premul_sum"  # the PREMUL_SUM(factor) reduce op, on float32/float64
MOVED_DTYPES = (FLOAT8, NARROW_INT, COMPLEX)
REDUCED_DTYPES = (COMPLEX, PREMUL_SUM)


@dataclass
class FunctionalArgs:
    """What a rank passes to ``Functional.call`` besides the tensor."""

    group: object
    op: str = "sum"  # funcol spells reduce ops as strings
    dim: int = 0  # gather_dim / scatter_dim
    input_splits: list | None = None  # all_to_all_single (None: even)
    output_splits: list | None = None


@dataclass(frozen=True, kw_only=True)
class Functional:
    """The collective in torch.distributed._functional_collectives (out of place, returns a new tensor)."""

    names: tuple[str, ...]  # the funcol function, newest name first (2.13 renamed *_tensor to *_single)
    autograd: tuple[str, ...]  # its differentiable form, likewise; () when ``names`` is differentiable itself
    call: Callable[[Callable, object, FunctionalArgs], object]  # (funcol function, tensor, args) -> tensor
    adjoint: str  # the table collective whose oracle is its backward (all_gather's is reduce_scatter's)

    def function(self, differentiable: bool = False) -> Callable:
        import torch.distributed._functional_collectives as funcol

        names = (self.autograd or self.names) if differentiable else self.names
        return next(getattr(funcol, n) for n in names if hasattr(funcol, n))


@dataclass(frozen=True, kw_only=True)
class Coalesced:
    """How several calls of the collective are issued as one."""

    function: str | None = None  # torch.distributed's ``*_coalesced`` function, a list of tensors in one call
    call: Callable[[Callable, Args], object] | None = None  # how to call it
    manager: bool = False  # c10d coalesces it inside ``dist._coalescing_manager``


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One c10d collective entry point, as data (see the module docstring)."""

    name: str
    family: str
    form: str | None
    inputs: Slots
    outputs: Slots | None
    reduces: bool
    flow: str
    call: Callable[[Callable, Args], object]  # (one of ``entry_points``' functions, Args) -> Work or None
    oracle: Oracle  # (per group rank: its input chunks, op name, root group rank) -> per rank: output chunks
    bus_factor: Callable[[int], float]
    splits: tuple[str, ...] = ()  # split kinds the differential draws ("even", "uneven"); () = not split
    # names of the tensors in messages: (inputs, outputs)
    labels: tuple[str, str] = ("input", "output")
    # torch.distributed functions with this call's signature, the one ``issue`` uses first; () = (name,)
    entry_points: tuple[str, ...] = ()
    # the ProcessGroup methods it reaches the backend through (for the single-buffer ones torch 2.13's name first
    # and the older Backend name after: out-of-tree backends broke on one), and how: group_call(method, args)
    # with the method's options object. suites/c10d/test_method_names.py calls each on the default group,
    # suites/c10d/test_dist2.py on a torch.distributed._dist2 group (which only its methods reach)
    group_methods: tuple[str, ...] = ()
    group_call: Callable[[Callable, Args], object] | None = None
    async_entry_point: bool = False  # the entry-point clause also calls it with async_op=True (case <name>_async)
    coalesced: Coalesced = field(default_factory=Coalesced)
    dtypes_moved: tuple[str, ...] = ()  # MOVED_DTYPES it must carry bit for bit (suites/c10d/test_dtypes.py)
    dtypes_reduced: tuple[str, ...] = ()  # REDUCED_DTYPES it must reduce exactly (likewise)
    functional: Functional | None = None

    def issue(self, a: Args, entry_point: str | None = None):
        """Call it through ``entry_point`` (default: its first) with ``a``; returns the Work (async_op) or None."""
        return self.call(entry_point_function(entry_point or self.entry_point_names[0]), a)

    def issue_coalesced(self, a: Args):
        return self.coalesced.call(entry_point_function(self.coalesced.function), a)

    @property
    def entry_point_names(self) -> tuple[str, ...]:
        return self.entry_points or (self.name,)

    @property
    def rooted(self) -> bool:
        return self.flow != ALL_TO_ALL

    @property
    def in_place(self) -> bool:
        return self.outputs is IN_PLACE

    @property
    def allows_scalar(self) -> bool:
        """A 0-d tensor is possible unless chunks are concatenated into one tensor."""
        sides = [self.inputs] + ([] if self.outputs is None else [self.outputs])
        return not any(s.chunks == PER_RANK and s.packing == "tensor" for s in sides)

    @property
    def partitioned(self) -> bool:
        """The buffer is one chunk per rank on some side (nccl-tests' count is then n x chunk)."""
        sides = [self.inputs] + ([] if self.outputs is None else [self.outputs])
        return any(s.chunks == PER_RANK for s in sides)

    @property
    def bench_name(self) -> str:
        """The benchmark's name: nccl-tests' (the family) for the one-tensor forms, else ``family_form``
        (``all_gather_list`` for torch's list form)."""
        return self.family if self.form in (None, "single") else f"{self.family}_{self.form}"

    def need(self) -> dict:
        """The capability requirements calling it states (backends/spec.py REQUIREMENT_KEYS)."""
        need = {"collective": self.family}
        if self.form is not None:
            need["form"] = self.form
        return need


# ------------------------------------------------------------- packing
def pack(slots: Slots, chunks: list) -> list:
    """The tensors a rank passes for ``slots``, made of its chunks (in group-rank order)."""
    if slots.packing == "list" or slots.chunks == ONE_CHUNK:
        return list(chunks)
    import torch

    return [torch.cat(chunks)]


def unpack(slots: Slots, tensors: list, rows: Sequence[int]) -> list:
    """The chunks of what a rank passes or got for ``slots`` (``rows``: dim-0 size of each chunk)."""
    if slots.packing == "list" or slots.chunks == ONE_CHUNK:
        return list(tensors)
    flat, chunks, start = tensors[0], [], 0
    for n in rows:
        chunks.append(flat[start:start + n])
        start += n
    return chunks


def args_for(entry: "Collective", chunks: list, blank: Callable[[int], object], *, group_size: int,
             is_root: bool, op=None, root: int | None = None, group=None, async_op: bool = False) -> Args:
    """A rank's Args for ``entry`` from its input chunks (``entry.inputs.count`` of them) and ``blank(j)``,
    a fresh output chunk j; the sides this rank does not pass (root-only ones elsewhere) are left empty."""
    ins = pack(entry.inputs, chunks) if entry.inputs.passed_by(is_root) else []
    outs = []
    if entry.outputs is not None and entry.outputs.passed_by(is_root):
        outs = pack(entry.outputs, [blank(j) for j in range(entry.outputs.count(group_size))])
    return Args(ins, outs, op=op, root=root if entry.rooted else None, group=group, async_op=async_op)


def result_chunks(entry: "Collective", a: Args, rows: Sequence[int]) -> list:
    """What the call left on this rank, as chunks (``rows``: dim-0 size of each): the input for an in-place
    collective, else the outputs ([] where this rank passes none)."""
    if entry.in_place:
        return unpack(entry.inputs, a.inputs, rows)
    return unpack(entry.outputs, a.outputs, rows) if a.outputs else []


# ------------------------------------------------------ how ranks issue them
def _dist():
    import torch.distributed as dist

    return dist


def _compat():
    from suites import compat

    return compat


def entry_point_function(name: str) -> Callable:
    """The torch.distributed function ``name``; the 2.13 names (``all_gather_single``, ...) through
    suites/compat.py, which falls back to the older name on an older torch."""
    return getattr(_compat(), name, None) or getattr(_dist(), name)


# Each calls ``method`` (a bound ProcessGroup method of the collective's group_methods) with an Args.
def _group_call_all_gather(method, a: Args):
    return method(a.outputs[0], a.inputs[0], _dist().distributed_c10d.AllgatherOptions())


def _group_call_reduce_scatter(method, a: Args):
    opts = _dist().distributed_c10d.ReduceScatterOptions()
    opts.reduceOp = a.op
    return method(a.outputs[0], a.inputs[0], opts)


def _group_call_all_to_all(method, a: Args):
    return method(a.outputs[0], a.inputs[0], [], [], _dist().distributed_c10d.AllToAllOptions())


# The list collectives' methods (ProcessGroup.allreduce, ...) take lists of tensors and an options object whose
# rootRank is a rank of the group: Args.root, since these are called on groups of every rank (global = group rank).
def _options(kind: str, a: Args):
    opts = getattr(_dist().distributed_c10d, kind)()
    if a.op is not None and hasattr(opts, "reduceOp"):
        opts.reduceOp = a.op
    if a.root is not None:
        opts.rootRank = a.root
    return opts


def _group_call_in_place(kind: str, method, a: Args):  # bound to its options kind with partial (records pickle)
    return method(a.inputs, _options(kind, a))


def _group_call_all_gather_list(method, a: Args):
    return method([a.outputs], a.inputs, _options("AllgatherOptions", a))


def _group_call_gather(method, a: Args):  # only the root passes a gather list
    return method([a.outputs] if a.outputs else [], a.inputs, _options("GatherOptions", a))


def _group_call_scatter(method, a: Args):  # only the root passes a scatter list
    return method(a.outputs, [a.inputs] if a.inputs else [], _options("ScatterOptions", a))


def _group_call_reduce_scatter_list(method, a: Args):
    return method(a.outputs, [a.inputs], _options("ReduceScatterOptions", a))


def _group_call_all_to_all_list(method, a: Args):
    return method(a.outputs, a.inputs, _options("AllToAllOptions", a))


# Each calls ``fn`` (one of the collective's entry points, all of one signature) with an Args.
def _call_all_reduce(fn, a: Args):
    return fn(a.inputs[0], op=a.op, group=a.group, async_op=a.async_op)


def _call_reduce(fn, a: Args):
    return fn(a.inputs[0], dst=a.root, op=a.op, group=a.group, async_op=a.async_op)


def _call_broadcast(fn, a: Args):
    return fn(a.inputs[0], src=a.root, group=a.group, async_op=a.async_op)


def _call_all_gather(fn, a: Args):
    return fn(a.outputs, a.inputs[0], group=a.group, async_op=a.async_op)


def _call_all_gather_into_tensor(fn, a: Args):
    return fn(a.outputs[0], a.inputs[0], group=a.group, async_op=a.async_op)


def _call_gather(fn, a: Args):
    return fn(a.inputs[0], gather_list=a.outputs or None, dst=a.root, group=a.group, async_op=a.async_op)


def _call_scatter(fn, a: Args):
    return fn(a.outputs[0], scatter_list=a.inputs or None, src=a.root, group=a.group, async_op=a.async_op)


def _call_reduce_scatter(fn, a: Args):
    return fn(a.outputs[0], a.inputs, op=a.op, group=a.group, async_op=a.async_op)


def _call_reduce_scatter_tensor(fn, a: Args):
    return fn(a.outputs[0], a.inputs[0], op=a.op, group=a.group, async_op=a.async_op)


def _call_all_to_all(fn, a: Args):
    return fn(a.outputs, a.inputs, group=a.group, async_op=a.async_op)


def _call_all_to_all_single(fn, a: Args):
    return fn(a.outputs[0], a.inputs[0], output_split_sizes=a.output_splits, input_split_sizes=a.input_splits,
              group=a.group, async_op=a.async_op)


# The ``*_coalesced`` functions: several calls as one. Args.inputs: each call's (one) input tensor;
# Args.outputs: each call's outputs, as ``outputs`` lays them out ([] for in-place collectives).
def _call_all_reduce_coalesced(fn, a: Args):
    with warnings.catch_warnings():  # torch deprecates it; it is still a c10d entry point
        warnings.simplefilter("ignore")
        return fn(a.inputs, op=a.op, group=a.group, async_op=a.async_op)


def _call_all_gather_coalesced(fn, a: Args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn([list(per_rank) for per_rank in zip(*a.outputs)], a.inputs, group=a.group, async_op=a.async_op)


# ------------------------------------------------------------ the oracle
# Each takes, per group rank, its input chunks (root-only inputs: [] elsewhere)
# and returns, per group rank, its output chunks (None: unspecified, [] none).
def _semantics():
    from backends.reference import semantics

    return semantics


def _firsts(inputs):
    return [chunks[0] for chunks in inputs]


def _oracle_all_reduce(inputs, op, root):
    return [[t] for t in _semantics().all_reduce(_firsts(inputs), op)]


def _oracle_reduce(inputs, op, root):
    result = _semantics().reduce(_firsts(inputs), op, root)
    return [[result if g == root else None] for g in range(len(inputs))]


def _oracle_broadcast(inputs, op, root):
    return [[t] for t in _semantics().broadcast(_firsts(inputs), root)]


def _oracle_all_gather(inputs, op, root):
    return _semantics().all_gather(_firsts(inputs))


def _oracle_gather(inputs, op, root):
    gathered = _semantics().gather(_firsts(inputs), root)
    return [gathered if g == root else [] for g in range(len(inputs))]


def _oracle_scatter(inputs, op, root):
    return [[t] for t in _semantics().scatter(inputs[root], len(inputs))]


def _oracle_reduce_scatter(inputs, op, root):
    return [[t] for t in _semantics().reduce_scatter(inputs, op)]


def _oracle_all_to_all(inputs, op, root):
    return _semantics().all_to_all(inputs)


def _oracle_all_to_all_single(inputs, op, root):
    """semantics.all_to_all_single over the flat inputs and their split sizes, cut back into chunks."""
    import torch

    n = len(inputs)
    flats = [torch.cat(chunks) for chunks in inputs]
    splits = [[c.shape[0] for c in chunks] for chunks in inputs]
    outs = _semantics().all_to_all_single(flats, splits)
    return [unpack(FLAT, [outs[j]], [splits[i][j] for i in range(n)]) for j in range(n)]


# ------------------------------------------------------------ bus factors
def _bus_all_reduce(n: int) -> float:
    return 2.0 * (n - 1) / n


def _bus_partitioned(n: int) -> float:
    return (n - 1) / n


def _bus_one(n: int) -> float:
    return 1.0


# ------------------------------------------------- functional collectives
def _funcol_all_reduce(fn, x, a: FunctionalArgs):
    return fn(x, a.op, a.group)


def _funcol_all_gather(fn, x, a: FunctionalArgs):
    return fn(x, a.dim, a.group)


def _funcol_reduce_scatter(fn, x, a: FunctionalArgs):
    return fn(x, a.op, a.dim, a.group)


def _funcol_all_to_all_single(fn, x, a: FunctionalArgs):
    return fn(x, a.output_splits, a.input_splits, a.group)


# -------------------------------------------------------------- the table
MOVED_BY_ALL = (FLOAT8, NARROW_INT)  # what every data-moving collective carries in the dtype clauses
# COMPLEX: moved by broadcast and all_gather (torch hands the backend their real view), reduced by the
# collectives torch hands complex tensors as they are (reduce, reduce_scatter); all_reduce's complex
# arithmetic has clauses of its own in test_dtypes.py (dist.all_reduce takes the real view, the group does not)
TABLE: dict[str, Collective] = {c.name: c for c in (
    Collective(name="all_reduce", family="all_reduce", form=None, inputs=ONE, outputs=IN_PLACE, reduces=True,
               flow=ALL_TO_ALL, call=_call_all_reduce, oracle=_oracle_all_reduce, bus_factor=_bus_all_reduce,
               labels=("tensor", "tensor"), async_entry_point=True, group_methods=("allreduce",),
               group_call=partial(_group_call_in_place, "AllreduceOptions"),
               coalesced=Coalesced(function="all_reduce_coalesced", call=_call_all_reduce_coalesced, manager=True),
               dtypes_reduced=(PREMUL_SUM,),
               functional=Functional(names=("all_reduce",), autograd=(), call=_funcol_all_reduce,
                                     adjoint="all_reduce")),
    Collective(name="reduce", family="reduce", form=None, inputs=ONE, outputs=IN_PLACE, reduces=True, flow=TO_ROOT,
               call=_call_reduce, oracle=_oracle_reduce, bus_factor=_bus_one, labels=("tensor", "tensor"),
               group_methods=("reduce",), group_call=partial(_group_call_in_place, "ReduceOptions"),
               dtypes_reduced=(COMPLEX, PREMUL_SUM)),
    Collective(name="broadcast", family="broadcast", form=None, inputs=ONE, outputs=IN_PLACE, reduces=False,
               flow=FROM_ROOT, call=_call_broadcast, oracle=_oracle_broadcast, bus_factor=_bus_one,
               labels=("tensor", "tensor"), group_methods=("broadcast",),
               group_call=partial(_group_call_in_place, "BroadcastOptions"), dtypes_moved=MOVED_BY_ALL + (COMPLEX,)),
    Collective(name="all_gather", family="all_gather", form="list", inputs=ONE, outputs=LIST, reduces=False,
               flow=ALL_TO_ALL, call=_call_all_gather, oracle=_oracle_all_gather, bus_factor=_bus_partitioned,
               group_methods=("allgather",), group_call=_group_call_all_gather_list,
               coalesced=Coalesced(function="all_gather_coalesced", call=_call_all_gather_coalesced),
               dtypes_moved=MOVED_BY_ALL + (COMPLEX,)),
    Collective(name="all_gather_into_tensor", family="all_gather", form="single", inputs=ONE, outputs=FLAT,
               reduces=False, flow=ALL_TO_ALL, call=_call_all_gather_into_tensor, oracle=_oracle_all_gather,
               bus_factor=_bus_partitioned,
               entry_points=("all_gather_single", "all_gather_into_tensor", "_all_gather_base"),
               group_methods=("all_gather_single", "_allgather_base"), group_call=_group_call_all_gather,
               coalesced=Coalesced(manager=True), dtypes_moved=MOVED_BY_ALL,
               functional=Functional(names=("all_gather_single", "all_gather_tensor"),
                                     autograd=("all_gather_single_autograd", "all_gather_tensor_autograd"),
                                     call=_funcol_all_gather, adjoint="reduce_scatter_tensor")),
    Collective(name="gather", family="gather", form=None, inputs=ONE, outputs=ROOT_LIST, reduces=False, flow=TO_ROOT,
               call=_call_gather, oracle=_oracle_gather, bus_factor=_bus_partitioned, labels=("input", "gather_list"),
               group_methods=("gather",), group_call=_group_call_gather, dtypes_moved=MOVED_BY_ALL),
    Collective(name="scatter", family="scatter", form=None, inputs=ROOT_LIST, outputs=ONE, reduces=False,
               flow=FROM_ROOT, call=_call_scatter, oracle=_oracle_scatter, bus_factor=_bus_partitioned,
               labels=("scatter_list", "output"), group_methods=("scatter",), group_call=_group_call_scatter,
               dtypes_moved=MOVED_BY_ALL),
    Collective(name="reduce_scatter", family="reduce_scatter", form="list", inputs=LIST, outputs=ONE, reduces=True,
               flow=ALL_TO_ALL, call=_call_reduce_scatter, oracle=_oracle_reduce_scatter, bus_factor=_bus_partitioned,
               dtypes_reduced=(COMPLEX,), group_methods=("reduce_scatter",),
               group_call=_group_call_reduce_scatter_list),
    Collective(name="reduce_scatter_tensor", family="reduce_scatter", form="single", inputs=FLAT, outputs=ONE,
               reduces=True, flow=ALL_TO_ALL, call=_call_reduce_scatter_tensor, oracle=_oracle_reduce_scatter,
               bus_factor=_bus_partitioned,
               entry_points=("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"),
               group_methods=("reduce_scatter_single", "_reduce_scatter_base"), group_call=_group_call_reduce_scatter,
               coalesced=Coalesced(manager=True), dtypes_reduced=(COMPLEX, PREMUL_SUM),
               functional=Functional(names=("reduce_scatter_single", "reduce_scatter_tensor"),
                                     autograd=("reduce_scatter_single_autograd", "reduce_scatter_tensor_autograd"),
                                     call=_funcol_reduce_scatter, adjoint="all_gather_into_tensor")),
    Collective(name="all_to_all_single", family="all_to_all", form="single", inputs=FLAT, outputs=FLAT, reduces=False,
               flow=ALL_TO_ALL, call=_call_all_to_all_single, oracle=_oracle_all_to_all_single,
               bus_factor=_bus_partitioned, splits=("even", "uneven"),
               group_methods=("all_to_all_single", "alltoall_base"), group_call=_group_call_all_to_all,
               dtypes_moved=MOVED_BY_ALL,
               functional=Functional(names=("all_to_all_single",), autograd=("all_to_all_single_autograd",),
                                     call=_funcol_all_to_all_single, adjoint="all_to_all_single")),
    Collective(name="all_to_all", family="all_to_all", form="list", inputs=LIST, outputs=LIST, reduces=False,
               flow=ALL_TO_ALL, call=_call_all_to_all, oracle=_oracle_all_to_all, bus_factor=_bus_partitioned,
               splits=("even",), group_methods=("alltoall",), group_call=_group_call_all_to_all_list,
               dtypes_moved=MOVED_BY_ALL),
)}


# The requirement vocabulary knows this table's families and forms, entries added later included
# (backends/spec.py cannot import this module: it imports backends).
requirements.add_value_source("collective", lambda: (c.family for c in TABLE.values()))
requirements.add_value_source("form", lambda: (c.form for c in TABLE.values() if c.form is not None))


class UnknownCollective(ValueError):
    pass


def names() -> list[str]:
    return list(TABLE)


def get(name: str) -> Collective:
    try:
        return TABLE[name]
    except KeyError:
        raise UnknownCollective(f"unknown collective {name!r}; known: {', '.join(TABLE)}") from None


def need(name: str) -> dict:
    """The requirements a case calling collective ``name`` states (its family and form), for needs() markers."""
    return get(name).need()


def bench_names() -> list[str]:
    """Every collective under its benchmark name (nccl-tests' where it has one)."""
    return [c.bench_name for c in TABLE.values()]


def by_bench_name(name: str) -> Collective:
    for collective in TABLE.values():
        if collective.bench_name == name:
            return collective
    raise UnknownCollective(f"unknown collective {name!r}; expected one of {', '.join(bench_names())}")


def with_dtypes_moved(group: str) -> list[Collective]:
    """The collectives the dtype clauses move ``group`` (one of MOVED_DTYPES) through."""
    return [c for c in TABLE.values() if group in c.dtypes_moved]


def with_dtypes_reduced(group: str) -> list[Collective]:
    return [c for c in TABLE.values() if group in c.dtypes_reduced]


def coalescing_managed() -> list[Collective]:
    """The collectives c10d coalesces inside ``dist._coalescing_manager``."""
    return [c for c in TABLE.values() if c.coalesced.manager]


def functional() -> list[Collective]:
    """The collectives with a functional form (torch.distributed._functional_collectives)."""
    return [c for c in TABLE.values() if c.functional is not None]
