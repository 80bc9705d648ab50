"""Contract: a flight recorder sees every call a backend runs, and its dump explains a hang.

PyTorch 2.13's recorder is backend-generic: a backend records each collective
and p2p call (``FlightRecorder<c10::Event>::record``) and
``torch._C._distributed_c10d._dump_fr_trace[_json]`` dumps what it holds; the
analyser ``python -m torch.distributed.flight_recorder.fr_trace`` reads one
pickled dump per rank and names the ranks missing from a collective. The
recorder is on unless ``TORCH_FR_BUFFER_SIZE`` (or ``TORCH_NCCL_TRACE_BUFFER_SIZE``)
is 0: its size is read once, when the first group of the process records or is
created, which in a rank process is after the harness set the rank's environment
(``fixtures/rank.py``, ``attach``), so the harness sets nothing and a rank whose
recorder is off says so.

The buffer is per process and the world's rank processes serve many cases, so
every clause runs its calls on a fresh group and reads only the entries that
name it. Per rank and call: one entry with the call's name, input and output
sizes and dtypes, the group's name and description; ``collective_seq_id``
(``p2p_seq_id`` for p2p) equal on every rank for the same call and growing;
``state`` "completed" once the Work was waited for; ``pg_status`` and
``pg_config`` describing the group; the pickled dumps accepted by ``fr_trace``,
which, after one rank skipped a collective and the others' Work timed out
(group timeout, not the harness deadline), names that rank and the collective.

Every clause reads one recorder (``recorder``): torch's own, which is what
torch's tooling and users' tools read, or the backend's own, which a backend
that cannot record into torch's (one written in Python, the reference, or built out of tree, native)
registers through backends/flight_recorders.py and the harness's hang reports
merge with torch's. A backend whose spec names none (``own_flight_recorder``) skips its ``backend`` cases;
one that records only into its own keeps a gap for its ``torch`` cases.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from backends.spec import RECORDERS
from fixtures.flight_dump import BACKEND, FR_SIZE_VARS, recorded_json, recorded_pickle, recorder_size
from fixtures.rank import ctx
from suites.c10d.timeouts import fresh_group

# every clause, once per recorder it can read (states the requirement recorder=, backends/spec.py); the
# ``recorder`` fixture below skips what a backend does not keep
pytestmark = pytest.mark.parametrize("recorder", RECORDERS, indirect=True)

HANG_TIMEOUT_S = 0.5
SETTLE_S = 2.0  # how long a waited Work's entry may take to leave "scheduled" (a watchdog may retire it)
DUMP_PREFIX = "rank_"  # fr_trace's --prefix: the rest of the file name is the rank

# c10::toString(ScalarType), as the dump spells dtypes
DTYPE_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long"}

# The calls of the collectives clause: (name, dtype, input shape); each rank's entry must say these.
COLLECTIVES = (
    ("all_reduce", torch.float32, (4,)),
    ("broadcast", torch.int64, (2, 3)),
    ("all_gather", torch.float64, (3,)),
)


# ------------------------------------------------------------------ rank side
def recorder_dump(recorder: str) -> dict:
    """This process's ``recorder`` ("torch" or "backend"), as JSON (without stack traces); fails saying why when
    it is off.

    A dump without entries has no "entries" key: that reads as an empty list."""
    if recorder_size() <= 0:
        settings = {var: os.environ.get(var) for var in FR_SIZE_VARS}
        raise RuntimeError(f"the flight recorder is off in rank {ctx.rank} ({settings}): no entries to read")
    dump = recorded_json(recorder)
    dump.setdefault("entries", [])
    return dump


def group_identity(group) -> list[str]:
    """How the recorder should name ``group``: [name, description]."""
    return [group.group_name, group.group_desc]


def entries_of(dump: dict, group, after: int = -1) -> list[dict]:
    """``group``'s entries recorded after record id ``after``: a rank process serves many cases, and torch
    reuses a destroyed group's name, so an earlier group of the same name may have left entries."""
    return [e for e in dump["entries"] if list(e["process_group"]) == group_identity(group) and e["record_id"] > after]


def last_record(group, recorder: str) -> int:
    """The newest record id already naming ``group`` (an earlier group of that name), -1 when none."""
    return max((e["record_id"] for e in entries_of(recorder_dump(recorder), group)), default=-1)


# How the clauses call each of COLLECTIVES: the calls whose recorder entries they read (data, group -> Work).
CALLS = {
    "all_reduce": lambda data, group: dist.all_reduce(data, group=group, async_op=True),
    "broadcast": lambda data, group: dist.broadcast(data, src=0, group=group, async_op=True),
    "all_gather": lambda data, group: dist.all_gather(
        [torch.empty_like(data) for _ in range(dist.get_world_size(group))], data, group=group, async_op=True),
}

GATHERING = {"all_gather"}  # of CALLS, those whose output is one tensor per rank


def issue(name: str, dtype: torch.dtype, shape: tuple, group) -> None:
    data = torch.full(shape, ctx.rank + 1, dtype=dtype, device=ctx.device)
    CALLS[name](data, group).wait()


def ring_p2p(group) -> None:
    """Each rank sends to the next and receives from the previous one (isend first, then irecv)."""
    n = dist.get_world_size(group)
    out = torch.full((5,), float(ctx.rank), device=ctx.device)
    into = torch.empty(5, device=ctx.device)
    works = [dist.isend(out, dst=(ctx.rank + 1) % n, group=group),
             dist.irecv(into, src=(ctx.rank - 1) % n, group=group)]
    for work in works:
        work.wait()


def settled(group, count: int, after: int, recorder: str) -> dict:
    """The dump once ``count`` entries of ``group`` are all "completed", or the last one after SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        dump = recorder_dump(recorder)
        mine = entries_of(dump, group, after)
        if (len(mine) >= count and all(e["state"] == "completed" for e in mine)) or time.monotonic() > deadline:
            return dump
        time.sleep(0.05)


def record_calls(kind: str, recorder: str, settle: bool = False) -> dict:
    """Run the clause's calls on a fresh group; return what ``recorder`` holds of that group
    (``settle``: once its entries completed, or SETTLE_S later)."""
    group = dist.new_group()
    after = last_record(group, recorder)
    try:
        if kind == "collectives":
            for name, dtype, shape in COLLECTIVES:
                issue(name, dtype, shape, group)
            expected = len(COLLECTIVES)
        else:
            ring_p2p(group)
            expected = 2
        dump = settled(group, expected, after, recorder) if settle else recorder_dump(recorder)
        return {"entries": entries_of(dump, group, after), "identity": group_identity(group),
                "ranks": dist.get_process_group_ranks(group), "pg_config": dump.get("pg_config", {}),
                "pg_status": dump.get("pg_status", {}),
                "default": group_identity(dist.group.WORLD)}
    finally:
        dist.destroy_process_group(group)


def write_dump(directory: str, group, after: int, recorder: str) -> int:
    """This rank's pickled dump of ``recorder``, as it wrote it, where fr_trace expects it (``<dir>/rank_<rank>``),
    holding only ``group``'s entries: the process's recorder also holds earlier cases' groups, and fr_trace
    filters groups only when it just prints entries (``--pg-filters`` needs ``-j``).

    The kept entries' record ids count from 0: fr_trace lines the ranks up by record id (it drops every entry
    before the highest first id, align_trace_from_beginning), which holds only for processes that recorded the
    same calls since they started, and the world's processes served earlier cases (after a hang case the rank
    that stayed away is one entry behind: fr_trace then dropped its every entry of this group and called it
    missing from collectives it joined)."""
    recorder_dump(recorder)  # fails saying why when the recorder is off
    dump = recorded_pickle(recorder)
    dump["entries"] = [e for e in dump.get("entries", [])
                       if list(e["process_group"]) == group_identity(group) and e["record_id"] > after]
    for index, entry in enumerate(dump["entries"]):
        entry["record_id"] = index
    with open(os.path.join(directory, f"{DUMP_PREFIX}{ctx.rank}"), "wb") as fh:
        pickle.dump(dump, fh)
    return len(dump["entries"])


def healthy_calls_dumped(directory: str, recorder: str) -> tuple[str, int]:
    """A fresh group's collectives completed on every rank, then every rank's dump written.
    Returns (group name, how many entries the dump holds)."""
    group = dist.new_group()
    after = last_record(group, recorder)
    for name, dtype, shape in COLLECTIVES:
        issue(name, dtype, shape, group)
    written = write_dump(directory, group, after, recorder)
    name = group.group_name
    dist.destroy_process_group(group)
    return name, written


def hang_dumped(directory: str, absent: int, recorder: str) -> tuple[str, str | None]:
    """One all_reduce every rank joins, then one ``absent`` skips: the others' Work times out at the group
    timeout; then every rank writes its dump. Returns (group name, the participant's error or None)."""
    group = fresh_group(HANG_TIMEOUT_S)
    after = last_record(group, recorder)
    data = torch.ones(4, device=ctx.device)
    dist.all_reduce(data, group=group)
    error = None
    if ctx.rank != absent:
        try:
            dist.all_reduce(data, group=group, async_op=True).wait()
        except Exception as exc:  # the expected timeout; its text is the finding
            error = f"{type(exc).__name__}: {exc}"
        ctx.store.set(f"finished/{ctx.rank}", "1")
    else:
        # stay in the group until the others gave up: leaving early fails them with "connection closed"
        ctx.store.wait([f"finished/{r}" for r in range(ctx.world_size) if r != absent],
                       timedelta(seconds=HANG_TIMEOUT_S + 60))
    write_dump(directory, group, after, recorder)
    name = group.group_name
    ctx.store.set(f"dumped/{ctx.rank}", "1")
    ctx.store.wait([f"dumped/{r}" for r in range(ctx.world_size)], timedelta(seconds=60))
    dist.destroy_process_group(group)
    return name, error


# ------------------------------------------------------------------ pytest side
@pytest.fixture
def recorder(request, world) -> str:
    """The recorder a case reads; a ``backend`` case skips when the backend's spec names no recorder of its own
    (``own_flight_recorder``): its entries are in torch's (its ``torch`` cases read them) or nowhere (its ``torch``
    cases' gap says so). Where the spec names one, the case runs whatever the ranks registered: a recorder that is
    not registered holds nothing the clause can read, and the clause's own checks fail on that."""
    if request.param == BACKEND and not world.spec.own_flight_recorder:
        pytest.skip(f"{world.spec.name} keeps no flight recorder of its own (its spec names none: "
                    f"own_flight_recorder); the recorder=torch cases read what it records")
    return request.param


def expect_one_entry_per_call(results, calls: list[tuple[str, str]]) -> None:
    """Every rank recorded exactly ``calls`` ((name, what) pairs) on the fresh group, in order."""
    for rank, seen in enumerate(results):
        names = [e["profiling_name"] for e in seen["entries"]]
        assert len(names) == len(calls), (
            f"rank {rank}: {len(names)} recorder entries name the group {seen['identity']} "
            f"({names}), expected one per call: {[what for _, what in calls]}")
        for entry, (name, what) in zip(seen["entries"], calls):
            called = entry["profiling_name"].split(":", 1)[-1]  # "gloo:all_reduce" -> "all_reduce"
            assert called.startswith(name), f"rank {rank}: {what} recorded as {entry['profiling_name']!r}"


def analyse(directory) -> tuple[int, str]:
    """torch's own analyser (``fr_trace``) on the ranks' dumps, in this process; (exit status, its output).

    It reports through the "Flight Recorder" logger; its reader turns the garbage collector off
    (``read_dir``), which this process must not keep."""
    from torch.distributed.flight_recorder import fr_trace

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("Flight Recorder")
    handler = Collect()
    logger.addHandler(handler)
    was_collecting = gc.isenabled()
    status = 0
    try:
        fr_trace.main([str(directory), "--prefix", DUMP_PREFIX])
    except (Exception, SystemExit) as exc:  # the analyser's own failure (argparse exits) is the finding
        lines.append(f"{type(exc).__name__}: {exc}")
        status = 1
    finally:
        logger.removeHandler(handler)
        if was_collecting:
            gc.enable()
    return status, "\n".join(lines).strip()


def last_line(text: str) -> str:
    return text.splitlines()[-1] if text else "(no output)"


@pytest.mark.needs(flight_recorder="collectives")
def test_collectives_recorded(world, recorder, record_property):
    """Each collective leaves one entry per rank with its name, sizes, dtypes, group and an agreed sequence id."""
    results = world.run(record_calls, "collectives", recorder)
    n = world.world_size
    expect_one_entry_per_call(results, [(name, f"{name} {dtype} {shape}") for name, dtype, shape in COLLECTIVES])
    for rank, seen in enumerate(results):
        for entry, (name, dtype, shape) in zip(seen["entries"], COLLECTIVES):
            what = f"rank {rank}: {name} entry"
            sizes = [list(shape)]
            # a gather's output as one stacked tensor (how gloo records it) or one tensor per rank
            outputs = ([[n, *shape]], sizes * n) if name in GATHERING else (sizes,)
            assert entry["is_p2p"] is False, f"{what} says is_p2p"
            assert entry["input_sizes"] == sizes, f"{what}: input_sizes {entry['input_sizes']}, expected {sizes}"
            assert entry["output_sizes"] in outputs, \
                f"{what}: output_sizes {entry['output_sizes']}, expected {' or '.join(map(str, outputs))}"
            assert entry["input_dtypes"] == [DTYPE_NAMES[dtype]], \
                f"{what}: input_dtypes {entry['input_dtypes']}, expected {[DTYPE_NAMES[dtype]]}"
            assert entry["output_dtypes"] == [DTYPE_NAMES[dtype]] * len(entry["output_sizes"]), \
                f"{what}: output_dtypes {entry['output_dtypes']}"
    sequences = [[e["collective_seq_id"] for e in seen["entries"]] for seen in results]
    assert all(s == sequences[0] for s in sequences), f"collective_seq_id differs between ranks: {sequences}"
    assert all(b > a for a, b in zip(sequences[0], sequences[0][1:])), \
        f"collective_seq_id does not grow from call to call: {sequences[0]}"
    record_property("finding", f"{results[0]['entries'][0]['profiling_name']}: collective_seq_id {sequences[0]}")


@pytest.mark.min_world_size(2)  # a send needs a peer: torch refuses a send to the own rank
@pytest.mark.needs(flight_recorder="p2p")
def test_p2p_recorded(world, recorder):
    """Each send and recv leaves one p2p entry on its rank, and the same call has the same p2p_seq_id everywhere."""
    results = world.run(record_calls, "p2p", recorder)
    n = world.world_size
    expect_one_entry_per_call(results, [("send", "isend to the next rank"), ("recv", "irecv from the previous")])
    for rank, seen in enumerate(results):
        for entry in seen["entries"]:
            assert entry["is_p2p"] is True, f"rank {rank}: {entry['profiling_name']} entry says is_p2p False"
            assert entry["input_sizes"] + entry["output_sizes"] and \
                all(size == [5] for size in entry["input_sizes"] + entry["output_sizes"]), \
                f"rank {rank}: {entry['profiling_name']} sizes {entry['input_sizes']} / {entry['output_sizes']}"
    sequences = [[e["p2p_seq_id"] for e in seen["entries"]] for seen in results]
    assert all(s == sequences[0] for s in sequences), \
        f"p2p_seq_id differs between ranks for the same call (ring of {n}): {sequences}"
    assert sequences[0][1] > sequences[0][0], f"p2p_seq_id does not grow from send to recv: {sequences[0]}"


@pytest.mark.needs(flight_recorder="completion")
def test_entries_complete_with_their_work(world, recorder):
    """An entry leaves "scheduled" once its Work completed: every waited call's state is "completed"."""
    results = world.run(record_calls, "collectives", recorder, True)
    for rank, seen in enumerate(results):
        states = {e["profiling_name"]: e["state"] for e in seen["entries"]}
        assert seen["entries"] and all(s == "completed" for s in states.values()), \
            f"rank {rank}: after wait() (and {SETTLE_S} s more) the entries' states are {states}"


@pytest.mark.needs(flight_recorder="pg_status")
def test_pg_status_follows_the_group(world, recorder):
    """pg_status gives the group's last enqueued, started and completed collective: the last one waited for."""
    results = world.run(record_calls, "collectives", recorder)
    for rank, seen in enumerate(results):
        name = seen["identity"][0]
        last = str(seen["entries"][-1]["collective_seq_id"]) if seen["entries"] else "(no entries)"
        status = seen["pg_status"].get(name)
        expected = {f"last_{stage}_collective": last for stage in ("enqueued", "started", "completed")}
        assert status == expected, f"rank {rank}: pg_status[{name!r}] is {status}, expected {expected}"


@pytest.mark.needs(flight_recorder="pg_config")
def test_pg_config_names_every_group(world, recorder):
    """pg_config lists the default group and a new one under the names their entries use, with their ranks."""
    results = world.run(record_calls, "collectives", recorder)
    for rank, seen in enumerate(results):
        for (name, desc), ranks in ((seen["identity"], seen["ranks"]),
                                    (seen["default"], list(range(world.world_size)))):
            expected = {"name": name, "desc": desc, "ranks": str(ranks)}
            assert seen["pg_config"].get(name) == expected, (
                f"rank {rank}: pg_config has no group {name!r} as its entries name it ({expected}); "
                f"it holds {seen['pg_config']}")


@pytest.mark.needs(flight_recorder="analyser")
def test_dumps_are_valid_analyser_input(world, recorder, tmp_path, record_property):
    """torch's fr_trace reads the ranks' dumps of completed collectives and reports no mismatch."""
    results = world.run(healthy_calls_dumped, str(tmp_path), recorder)
    name = results[0][0]
    written = [count for _, count in results]
    assert written == [len(COLLECTIVES)] * world.world_size, \
        f"the ranks' dumps hold {written} entries of group {name!r}, expected {len(COLLECTIVES)} each"
    status, output = analyse(tmp_path)
    assert status == 0, f"fr_trace exited {status} on the dumps of group {name!r}: {last_line(output)}\n{output}"
    assert "Not all ranks joining" not in output and "mismatch" not in output.lower(), \
        f"fr_trace reports a problem with calls every rank completed:\n{output}"
    record_property("finding", f"fr_trace: {last_line(output)}")


@pytest.mark.min_world_size(2)  # the missing rank is named by the ranks waiting for it
@pytest.mark.needs(flight_recorder="analyser", feature="group_timeout")
def test_hang_names_the_missing_rank(world, recorder, tmp_path, record_property):
    """After one rank skips an all_reduce and the others time out, fr_trace names that rank and the collective."""
    absent = world.world_size - 1
    results = world.run(hang_dumped, str(tmp_path), absent, recorder)
    pg_name = results[0][0]
    returned = [rank for rank, (_, error) in enumerate(results[:absent]) if error is None]
    assert not returned, f"ranks {returned} returned from an all_reduce rank {absent} never joined"
    status, output = analyse(tmp_path)
    assert status == 0, f"fr_trace exited {status} on the dumps of group {pg_name!r}: {last_line(output)}\n{output}"
    assert f"missing ranks: {{{absent}}}" in output, \
        f"fr_trace does not name rank {absent} as missing from the skipped all_reduce:\n{output}"
    assert "all_reduce" in output, f"fr_trace does not name the collective:\n{output}"
    record_property("finding", f"participants' error: {results[0][1]}")
