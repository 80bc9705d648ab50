"""Contract: collectives touch exactly the memory they were given.

Outputs placed at a storage offset inside a larger buffer are written and
nothing around them; out-of-place inputs stay unchanged; in-place calls on
this rank's chunk (FSDP) are exact; an output list of one buffer repeated
gets torch's outcome or a clear error and leaves the next call exact;
all_to_all where no rank, or only some, send anything is exact.

What production jobs hit once the values are right (resources, not results):

* guard regions: every tensor a collective gets sits at a storage offset in a
  larger buffer with slack after it (suites/guard_regions.py); the slack is
  unchanged afterwards and the inputs of an out-of-place call too. For the
  in-place collectives (all_reduce, reduce, broadcast) this is the in-place
  call on a view with a storage offset;
* in place on a chunk (FSDP): all_gather_into_tensor whose input is this
  rank's chunk of the output, reduce_scatter_tensor whose output is this
  rank's chunk of the input (the rest of that input is unspecified after the
  call: torch does not say, gloo leaves it alone);
* aliased output lists (``[buf] * N``, as vLLM passes them): torch's outcome
  (gloo, torch 2.13: the list is filled in order, so the one buffer ends up
  holding entry N-1) or a clear error on every rank that passed it; either
  way the next call with distinct buffers is exact;
* all_to_all (both forms) where no rank, or only the odd ranks, send anything
  (every tensor empty, or some).

Every collective of suites/collectives.py, read from the table (its layout
says what a rank passes, its oracle what every rank must hold), so an entry
added there is checked here too. Send/recv into guarded buffers:
suites/p2p/test_guard_regions.py.
"""

from __future__ import annotations

import pytest
import torch

from fixtures.rank import ctx
from suites import collectives, values
from suites.checks import expect_tensor
from suites.collectives import Args
from suites.guard_regions import expect_guarded, guarded, inside, unwritten, values_of

CHUNK = (5,)  # what a rank sends per destination / list entry: odd, not a multiple of any vector width
ROW = 3  # all_to_all rows are (rows, ROW): a backend counting rows as elements is caught
DTYPES = ("float32", "uint8")  # uint8: an overrun rounded up to a word shows in the bytes after the output
OP = "sum"


def root_of(entry: collectives.Collective, world_size: int) -> int | None:
    """The root of a rooted collective: the last rank (not 0, which a backend might assume)."""
    return world_size - 1 if entry.rooted else None


def cases(names: list[str]) -> list:
    """One case per collective, stating its requirements (family, form) as the table gives them."""
    return [pytest.param(name, id=name, marks=pytest.mark.needs(**collectives.need(name))) for name in names]


# The table's entries each clause covers: chosen by layout, never by name.
GUARDED = collectives.names()
# one side is one chunk, the other every rank's chunks as one tensor (all_gather_into_tensor, reduce_scatter_tensor)
CHUNK_IN_PLACE = [c.name for c in collectives.TABLE.values()
                  if {c.inputs, c.outputs} == {collectives.ONE, collectives.FLAT}]
# outputs are a Python list, one tensor per rank (all_gather, gather, all_to_all)
LIST_OUTPUTS = [c.name for c in collectives.TABLE.values() if c.outputs is not None and c.outputs.packing == "list"]
# takes split sizes (all_to_all_single, all_to_all)
SPLIT = [c.name for c in collectives.TABLE.values() if c.splits]


def input_chunks(entry: collectives.Collective, rank: int, world_size: int, dtype: str) -> list:
    """Rank ``rank``'s input chunks as the table lays them out ([] where it passes none)."""
    if not entry.inputs.passed_by(rank == root_of(entry, world_size)):
        return []
    return [values_of(dtype, rank, slot, CHUNK) for slot in range(entry.inputs.count(world_size))]


def expected_outputs(entry: collectives.Collective, world_size: int, dtype: str) -> list:
    """Per rank: its output chunks by the table's oracle (None: unspecified)."""
    chunks = [input_chunks(entry, r, world_size, dtype) for r in range(world_size)]
    return entry.oracle(chunks, OP, root_of(entry, world_size))


def issue(entry: collectives.Collective, inputs: list, outputs: list, **splits):
    return entry.issue(Args(inputs, outputs, op=values.reduce_op(OP) if entry.reduces else None,
                            root=root_of(entry, ctx.world_size), **splits))


# ---------------------------------------------------------------- rank side
def call_guarded(name: str, dtype: str) -> tuple[list, list]:
    """One call with every input and output guarded; (input buffers, output buffers) afterwards."""
    entry = collectives.get(name)
    n, me = ctx.world_size, ctx.rank
    ins = [guarded(t, ctx.device) for t in collectives.pack(entry.inputs, input_chunks(entry, me, n, dtype))]
    outs = []
    if entry.outputs is not None and entry.outputs.passed_by(me == root_of(entry, n)):
        fills = [unwritten(dtype, CHUNK) for _ in range(entry.outputs.count(n))]
        outs = [guarded(t, ctx.device) for t in collectives.pack(entry.outputs, fills)]
    issue(entry, [view for view, _ in ins], [view for view, _ in outs])
    return [buffer.cpu() for _, buffer in ins], [buffer.cpu() for _, buffer in outs]


def call_in_place_on_chunk(name: str, dtype: str) -> torch.Tensor:
    """The one-chunk side is this rank's chunk of the all-ranks side, itself guarded; that buffer afterwards."""
    entry = collectives.get(name)
    n, me = ctx.world_size, ctx.rank
    mine = input_chunks(entry, me, n, dtype)
    if entry.inputs == collectives.ONE:  # all_gather_into_tensor: the input is my chunk of the output
        whole, buffer = guarded(unwritten(dtype, (n * CHUNK[0],)), ctx.device)
        chunk = whole.chunk(n)[me]
        chunk.copy_(mine[0])
        issue(entry, [chunk], [whole])
    else:  # reduce_scatter_tensor: the output is my chunk of the input
        whole, buffer = guarded(torch.cat(mine), ctx.device)
        chunk = whole.chunk(n)[me]
        issue(entry, [whole], [chunk])
    return buffer.cpu()


def call_aliased_then_distinct(name: str, dtype: str) -> tuple[str | None, torch.Tensor | None, list]:
    """The call with one buffer as every output entry, then again with distinct buffers.

    (error of the aliased call or None, the aliased buffer, the distinct outputs' buffers).
    """
    entry = collectives.get(name)
    n, me = ctx.world_size, ctx.rank
    inputs = collectives.pack(entry.inputs, input_chunks(entry, me, n, dtype))
    passes = entry.outputs.passed_by(me == root_of(entry, n))
    error, aliased = None, None
    if passes:
        view, aliased = guarded(unwritten(dtype, CHUNK), ctx.device)
        outputs = [view] * entry.outputs.count(n)
    else:
        outputs = []
    try:
        issue(entry, [t.to(ctx.device) for t in inputs], outputs)
    except Exception as exc:  # noqa: BLE001 - a clear refusal is allowed; the controller judges its message
        error = f"{type(exc).__name__}: {exc}"
    distinct = [guarded(unwritten(dtype, CHUNK), ctx.device) for _ in range(entry.outputs.count(n) if passes else 0)]
    issue(entry, [t.to(ctx.device) for t in inputs], [view for view, _ in distinct])
    return error, None if aliased is None else aliased.cpu(), [buffer.cpu() for _, buffer in distinct]


def rows_sent(sender: int, receiver: int, senders: str) -> int:
    """Rows ``sender`` sends ``receiver``: none from a silent rank, else 1 + receiver."""
    silent = senders.startswith("nobody") or (senders == "odd_ranks" and sender % 2 == 0)
    return 0 if silent else 1 + receiver


def split_chunks(rank: int, world_size: int, senders: str, dtype: str) -> tuple[list, list]:
    """(what ``rank`` sends to each rank, the initial fill of what it receives from each), (rows, ROW) each."""
    sends = [values_of(dtype, rank, j, (rows_sent(rank, j, senders), ROW)) for j in range(world_size)]
    fills = [unwritten(dtype, (rows_sent(i, rank, senders), ROW)) for i in range(world_size)]
    return sends, fills


def call_sending_nothing(name: str, senders: str, dtype: str) -> tuple[list, list]:
    entry = collectives.get(name)
    n, me = ctx.world_size, ctx.rank
    sends, fills = split_chunks(me, n, senders, dtype)
    ins = [guarded(t, ctx.device) for t in collectives.pack(entry.inputs, sends)]
    outs = [guarded(t, ctx.device) for t in collectives.pack(entry.outputs, fills)]
    given = senders != "nobody_no_splits"  # else the even split of empty tensors, no sizes passed
    issue(entry, [view for view, _ in ins], [view for view, _ in outs],
          input_splits=[t.shape[0] for t in sends] if given else None,
          output_splits=[t.shape[0] for t in fills] if given else None)
    return [buffer.cpu() for _, buffer in ins], [buffer.cpu() for _, buffer in outs]


# ------------------------------------------------------------------ checks
def expect_inputs_unchanged(entry, rank: int, buffers: list, chunks: list, what: str) -> None:
    """Out of place: every input tensor as it was, and its guards intact."""
    for i, (buffer, original) in enumerate(zip(buffers, collectives.pack(entry.inputs, chunks))):
        index = f"[{i}]" if len(buffers) > 1 else ""
        expect_guarded(buffer, original, f"{what}: {entry.labels[0]}{index} on rank {rank} (unchanged)")


def packed_expected(entry, got: list) -> list:
    """The oracle's output chunks of one rank, packed as the rank passed its outputs (None stays None)."""
    if entry.outputs.packing == "tensor" and entry.outputs.chunks == collectives.PER_RANK:
        return [torch.cat(got)]
    return list(got)


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", cases(GUARDED))
def test_guard_regions(world, name, dtype):
    """Every collective writes only its outputs: guards around each tensor unchanged, out-of-place inputs unchanged."""
    entry = collectives.get(name)
    n = world.world_size
    expected = expected_outputs(entry, n, dtype)
    for rank, (in_buffers, out_buffers) in enumerate(world.run(call_guarded, name, dtype)):
        chunks = input_chunks(entry, rank, n, dtype)
        if entry.in_place:
            expect_guarded(in_buffers[0], expected[rank][0], f"{name} in place at storage offset on rank {rank}")
            continue
        expect_inputs_unchanged(entry, rank, in_buffers, chunks, name)
        wanted = packed_expected(entry, expected[rank]) if out_buffers else []
        assert len(out_buffers) == len(wanted), \
            f"{name} on rank {rank}: {len(out_buffers)} outputs, oracle {len(wanted)}"
        for i, (buffer, value) in enumerate(zip(out_buffers, wanted)):
            label = entry.labels[1] + (f"[{i}]" if len(out_buffers) > 1 else "")
            expect_guarded(buffer, value, f"{name}: {label} on rank {rank}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", cases(CHUNK_IN_PLACE))
def test_in_place_on_own_chunk(world, name, dtype):
    """In place on this rank's chunk (FSDP): all_gather_into_tensor and reduce_scatter_tensor are exact, guards intact."""
    entry = collectives.get(name)
    n = world.world_size
    expected = expected_outputs(entry, n, dtype)
    for rank, buffer in enumerate(world.run(call_in_place_on_chunk, name, dtype)):
        what = f"{name} in place on rank {rank}'s chunk"
        if entry.inputs == collectives.ONE:  # the whole output is the result
            expect_guarded(buffer, torch.cat(expected[rank]), f"{what}: the output")
        else:  # this rank's chunk is the result; the rest of the input is the backend's to use
            expect_guarded(buffer, None, what)
            whole = inside(buffer, (n * CHUNK[0],))
            expect_tensor(whole.chunk(n)[rank], expected[rank][0], f"{what}: the output (chunk {rank} of the input)")


ALIAS_WORDS = ("alias", "overlap", "same tensor", "same storage", "distinct", "duplicate", "repeated")


@pytest.mark.parametrize("name", cases(LIST_OUTPUTS))
def test_aliased_output_list(world, name):
    """An output list of one buffer repeated ([buf]*N) ends holding entry N-1 or fails clearly; the next call is exact."""
    entry = collectives.get(name)
    n, dtype = world.world_size, "float32"
    expected = expected_outputs(entry, n, dtype)
    for rank, (error, aliased, distinct) in enumerate(world.run(call_aliased_then_distinct, name, dtype)):
        if aliased is not None:
            if error is None:
                expect_guarded(aliased, expected[rank][-1], f"{name} into [buf]*{n} on rank {rank}: buf "
                                                            f"(torch fills the list in order: entry {n - 1})")
            else:
                assert any(word in error.lower() for word in ALIAS_WORDS), (
                    f"{name} into [buf]*{n} on rank {rank} failed without saying the outputs alias: {error}")
        else:
            assert error is None, f"{name} on rank {rank}, which passes no outputs, raised: {error}"
        assert len(distinct) == len(expected[rank]), \
            f"{name} on rank {rank}: {len(distinct)} outputs, oracle {len(expected[rank])}"
        for i, (buffer, value) in enumerate(zip(distinct, expected[rank])):
            expect_guarded(buffer, value, f"{name} with distinct outputs after the aliased call: "
                                          f"{entry.labels[1]}[{i}] on rank {rank}")


# Who sends: nobody (zero split sizes given), nobody_no_splits (empty tensors, no split sizes: the one-tensor
# form only, the list form takes none), odd_ranks (even ranks send nothing, odd rank i sends j+1 rows to j).
# Nobody sending moves only empty tensors: a shape= requirement, as backends' empty-tensor gaps are keyed.
SENDERS = {"nobody": {"split": "even", "shape": "empty"}, "nobody_no_splits": {"split": "even", "shape": "empty"},
           "odd_ranks": {"split": "uneven"}}
SENDING_CASES = [pytest.param(name, senders, id=f"{name}-{senders}",
                              marks=pytest.mark.needs(**collectives.need(name), **need))
                 for name in SPLIT for senders, need in SENDERS.items()
                 if senders != "nobody_no_splits" or collectives.get(name).inputs.packing == "tensor"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,senders", SENDING_CASES)
def test_all_to_all_sending_nothing(world, name, senders, dtype):
    """all_to_all where no rank, or only odd ranks, send anything: every chunk exact, guards intact, inputs unchanged."""
    entry = collectives.get(name)
    n = world.world_size
    chunks = [split_chunks(r, n, senders, dtype)[0] for r in range(n)]
    expected = entry.oracle(chunks, None, None)
    for rank, (in_buffers, out_buffers) in enumerate(world.run(call_sending_nothing, name, senders, dtype)):
        expect_inputs_unchanged(entry, rank, in_buffers, chunks[rank], f"{name} ({senders} sending)")
        for i, (buffer, value) in enumerate(zip(out_buffers, packed_expected(entry, expected[rank]))):
            label = entry.labels[1] + (f"[{i}]" if len(out_buffers) > 1 else "")
            expect_guarded(buffer, value, f"{name} ({senders} sending): {label} on rank {rank}")
