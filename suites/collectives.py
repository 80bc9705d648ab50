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
* ``issue``: how a rank calls it, from an ``Args``;
* ``oracle``: what every rank must hold afterwards, computed with
  backends/reference/semantics.py over every rank's input chunks;
* ``bus_factor``: nccl-tests' busbw / algbw at n ranks.

Readers: suites/c10d/differential.py (generated calls and their expectation),
suites/c10d/test_timeouts.py (a collective one rank skips), the requirements
(``need``) of the cases of suites/c10d/test_entry_points.py, test_dtypes.py
and test_bad_input.py,
suites/stress/rank_bench.py and suites/stress/metrics.py (the benchmark's
buffers, check and columns), suites/stress/collectives.py (its options).
Adding a collective is adding one entry to ``TABLE`` below; every reader
looks the table up when it runs, never a copy made at import.

The table lives in ``suites/`` beside values.py and compat.py because it is
knowledge of the contract's calls, shared by the contract suites and the
benchmarks (both under suites/); backends/ holds what backends *are*, and
the reference backend must not depend on the test side. Importing this
module does not import torch (the benchmark's --help stays instant): the
record functions import it when they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

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


@dataclass(frozen=True)
class Collective:
    """One c10d collective entry point, as data (see the module docstring)."""

    name: str
    family: str
    form: str | None
    inputs: Slots
    outputs: Slots | None
    reduces: bool
    flow: str
    issue: Callable[[Args], object]
    oracle: Oracle  # (per group rank: its input chunks, op name, root group rank) -> per rank: output chunks
    bus_factor: Callable[[int], float]
    splits: tuple[str, ...] = ()  # split kinds the differential draws ("even", "uneven"); () = not split
    # names of the tensors in messages: (inputs, outputs)
    labels: tuple[str, str] = ("input", "output")

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


# ------------------------------------------------------ how ranks issue them
def _dist():
    import torch.distributed as dist

    return dist


def _compat():
    from suites import compat

    return compat


def _issue_all_reduce(a: Args):
    return _dist().all_reduce(a.inputs[0], op=a.op, group=a.group, async_op=a.async_op)


def _issue_reduce(a: Args):
    return _dist().reduce(a.inputs[0], dst=a.root, op=a.op, group=a.group, async_op=a.async_op)


def _issue_broadcast(a: Args):
    return _dist().broadcast(a.inputs[0], src=a.root, group=a.group, async_op=a.async_op)


def _issue_all_gather(a: Args):
    return _dist().all_gather(a.outputs, a.inputs[0], group=a.group, async_op=a.async_op)


def _issue_all_gather_into_tensor(a: Args):
    return _compat().all_gather_single(a.outputs[0], a.inputs[0], group=a.group, async_op=a.async_op)


def _issue_gather(a: Args):
    return _dist().gather(a.inputs[0], gather_list=a.outputs or None, dst=a.root, group=a.group,
                          async_op=a.async_op)


def _issue_scatter(a: Args):
    return _dist().scatter(a.outputs[0], scatter_list=a.inputs or None, src=a.root, group=a.group,
                           async_op=a.async_op)


def _issue_reduce_scatter(a: Args):
    return _dist().reduce_scatter(a.outputs[0], a.inputs, op=a.op, group=a.group, async_op=a.async_op)


def _issue_reduce_scatter_tensor(a: Args):
    return _compat().reduce_scatter_single(a.outputs[0], a.inputs[0], op=a.op, group=a.group, async_op=a.async_op)


def _issue_all_to_all(a: Args):
    return _dist().all_to_all(a.outputs, a.inputs, group=a.group, async_op=a.async_op)


def _issue_all_to_all_single(a: Args):
    return _dist().all_to_all_single(a.outputs[0], a.inputs[0], output_split_sizes=a.output_splits,
                                     input_split_sizes=a.input_splits, group=a.group, async_op=a.async_op)


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


# -------------------------------------------------------------- the table
TABLE: dict[str, Collective] = {c.name: c for c in (
    Collective("all_reduce", "all_reduce", None, ONE, IN_PLACE, True, ALL_TO_ALL,
               _issue_all_reduce, _oracle_all_reduce, _bus_all_reduce, labels=("tensor", "tensor")),
    Collective("reduce", "reduce", None, ONE, IN_PLACE, True, TO_ROOT,
               _issue_reduce, _oracle_reduce, _bus_one, labels=("tensor", "tensor")),
    Collective("broadcast", "broadcast", None, ONE, IN_PLACE, False, FROM_ROOT,
               _issue_broadcast, _oracle_broadcast, _bus_one, labels=("tensor", "tensor")),
    Collective("all_gather", "all_gather", "list", ONE, LIST, False, ALL_TO_ALL,
               _issue_all_gather, _oracle_all_gather, _bus_partitioned),
    Collective("all_gather_into_tensor", "all_gather", "single", ONE, FLAT, False, ALL_TO_ALL,
               _issue_all_gather_into_tensor, _oracle_all_gather, _bus_partitioned),
    Collective("gather", "gather", None, ONE, ROOT_LIST, False, TO_ROOT,
               _issue_gather, _oracle_gather, _bus_partitioned, labels=("input", "gather_list")),
    Collective("scatter", "scatter", None, ROOT_LIST, ONE, False, FROM_ROOT,
               _issue_scatter, _oracle_scatter, _bus_partitioned, labels=("scatter_list", "output")),
    Collective("reduce_scatter", "reduce_scatter", "list", LIST, ONE, True, ALL_TO_ALL,
               _issue_reduce_scatter, _oracle_reduce_scatter, _bus_partitioned),
    Collective("reduce_scatter_tensor", "reduce_scatter", "single", FLAT, ONE, True, ALL_TO_ALL,
               _issue_reduce_scatter_tensor, _oracle_reduce_scatter, _bus_partitioned),
    Collective("all_to_all_single", "all_to_all", "single", FLAT, FLAT, False, ALL_TO_ALL,
               _issue_all_to_all_single, _oracle_all_to_all_single, _bus_partitioned, splits=("even", "uneven")),
    Collective("all_to_all", "all_to_all", "list", LIST, LIST, False, ALL_TO_ALL,
               _issue_all_to_all, _oracle_all_to_all, _bus_partitioned, splits=("even",)),
)}


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
