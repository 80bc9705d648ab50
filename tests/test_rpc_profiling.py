"""The reference agents' profiling envelope (backends/reference/rpc/profiling.py), in one process.

A loopback "agent" below drives the seams exactly as the agent core does
(caller: begin_call, request_fields, wrap_future, absorb_response; callee:
run_profiled on a pool thread; responses delivered on another thread), so
the envelope is checked without sockets: key format, renaming, shapes,
memory, async work collected when the response completes, errors, the
Kineto gate, and that remote events reach torch's own function_events,
key_averages, table and chrome trace. suites/profiling checks the same
against TensorPipe across processes.
"""

from __future__ import annotations

import json
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.autograd import profiler_legacy

from backends.reference.rpc import profiling

REMOTE = profiling.REMOTE_OP


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(4, thread_name_prefix="loopback") as executor:
        yield executor


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*profiler_legacy.*")
        yield


def _as_future(value):
    if isinstance(value, torch._C.Future):
        return value
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


class Loopback:
    """An in-process RPC agent over a thread pool that calls the profiling seams like agent.py."""

    def __init__(self, pool, name="worker0", callee_node=None):
        self.pool = pool
        self.name = name
        # One process has one profiler node id; ``callee_node`` stamps the callee's
        # own records as if they came from that rank's process.
        self.callee_node = callee_node
        self.requests = []  # the "profiling" field of every request sent

    def call(self, mode, func, args=(), dst="worker1"):
        call = profiling.begin_call(mode, func, self.name, dst)
        fields = profiling.request_fields(call) if call is not None else None
        self.requests.append(fields)
        raw = torch.futures.Future()

        def respond(value=None, envelope=None, error=None):
            def deliver():
                if call is not None:
                    profiling.absorb_response(call, envelope)
                if error is not None:
                    raw.set_exception(error)
                else:
                    raw.set_result(value)
            self.pool.submit(deliver)

        def serve():
            def run():
                return _as_future(func(*args))
            if fields is None:
                try:
                    respond(run().wait())
                except Exception as exc:
                    respond(error=exc)
                return
            fut = profiling.run_profiled(fields, run)

            def answered(done):
                try:
                    value, envelope = done.value()
                except Exception as exc:
                    respond(error=exc)
                else:
                    if self.callee_node is not None:
                        for records in envelope["events"]:
                            for r in records:
                                r["node_id"] = self.callee_node if r["node_id"] == -1 else r["node_id"]
                    respond(value, envelope)
            fut.add_done_callback(answered)

        self.pool.submit(serve)
        return profiling.wrap_future(call, raw) if call is not None else raw

    def __call__(self):  # a callable object, to name in a key
        return None


def legacy(**kwargs):
    return profiler_legacy.profile(**kwargs)


def names(prof):
    return [e.name for e in prof.function_events]


def by_name(prof, name):
    return [e for e in prof.function_events if e.name == name]


def udf_ops(x):
    return torch.relu(torch.mul(torch.add(x, 1), 2))


def failing_udf(x):
    torch.add(x, 1)
    raise ValueError("udf failed on purpose")


@torch.jit.script
def scripted(x: torch.Tensor) -> torch.Tensor:
    return x + 1


# ------------------------------------------------------------------ the key
def test_key_names_builtin_torchscript_and_python_functions():
    """The key is rpc_{mode}#{name}({src} -> {dst}) with builtin, TorchScript or __qualname__ names."""
    assert profiling.function_name(torch.add) == "aten::add"
    assert profiling.function_name(scripted) == torch._jit_internal._qualified_name(scripted)
    assert profiling.function_name(scripted).startswith("__torch__.")
    assert profiling.function_name(udf_ops) == "udf_ops"
    assert profiling.function_name(Loopback.call) == "Loopback.call"
    assert profiling.function_name(Loopback(None)) == "Loopback"  # a callable object: its type
    assert (profiling.rpc_profiling_key("sync", "aten::add", "worker0", "worker1")
            == "rpc_sync#aten::add(worker0 -> worker1)")
    from torch.distributed.rpc.internal import RPCExecMode, _build_rpc_profiling_key
    for mode in RPCExecMode:
        assert (profiling.rpc_profiling_key(mode.value, "f", "a", "b")
                == _build_rpc_profiling_key(mode, "f", "a", "b"))


# ------------------------------------------------------------- off switches
def test_no_profiler_no_envelope(pool):
    """An RPC with no profiler on carries no envelope and gets a plain future."""
    agent = Loopback(pool)
    assert profiling.begin_call("sync", torch.add, "worker0", "worker1") is None
    assert torch.equal(agent.call("sync", torch.add, (torch.ones(2), 1)).wait(), torch.full((2,), 2.0))
    assert agent.requests == [None]


def test_kineto_profiler_records_no_remote_events(pool):
    """Under the Kineto profiler nothing is wrapped: no rpc_ key, no remote_op events, a warning."""
    agent = Loopback(pool)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        profiling._warned_kineto.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            agent.call("sync", torch.add, (torch.ones(2), 1)).wait()
    assert agent.requests == [None]
    event_names = [e.name for e in prof.events()]
    assert not [n for n in event_names if n.startswith("rpc_") or REMOTE in n]
    assert profiling._warned_kineto, "no warning that the worker is not profiled"


# ---------------------------------------------------------------- envelope
def test_sync_builtin_remote_events_renamed_remote_and_inside_the_rpc(pool):
    """The callee's events come back renamed key#remote_op: name, remote, inside the caller's RPC range."""
    agent = Loopback(pool)
    with legacy(record_shapes=True) as prof:
        agent.call("sync", torch.add, (torch.ones(3), 1)).wait()
    key = "rpc_sync#aten::add(worker0 -> worker1)"
    [rpc] = by_name(prof, key)
    assert not rpc.is_remote
    [add] = by_name(prof, key + REMOTE + "aten::add")
    assert add.is_remote
    remote = [e for e in prof.function_events if e.is_remote]
    assert {e.name for e in remote} >= {key + REMOTE + n for n in ("aten::add", "aten::to", "aten::copy_")}
    for e in remote:
        assert e.name.startswith(key + REMOTE)
        assert rpc.time_range.start <= e.time_range.start <= e.time_range.end <= rpc.time_range.end, e
    assert agent.requests[0]["record_shapes"] is True and agent.requests[0]["profile_memory"] is False


def test_remote_shapes_equal_the_same_op_profiled_locally(pool):
    """With record_shapes a remote op's input shapes equal the same op profiled locally."""
    agent = Loopback(pool)
    with legacy(record_shapes=True) as local:
        torch.add(torch.ones(3), 1)
    with legacy(record_shapes=True) as prof:
        agent.call("async", torch.add, (torch.ones(3), 1)).wait()
    [local_add] = by_name(local, "aten::add")
    [remote_add] = by_name(prof, "rpc_async#aten::add(worker0 -> worker1)" + REMOTE + "aten::add")
    assert remote_add.input_shapes == local_add.input_shapes == [[3], [], []]


def test_without_record_shapes_or_profile_memory_nothing_is_recorded(pool):
    """Without record_shapes remote shapes are empty; without profile_memory remote memory is zero."""
    agent = Loopback(pool)
    with legacy() as prof:
        agent.call("sync", udf_ops, (torch.ones(4, 4),)).wait()
    remote = [e for e in prof.function_events if e.is_remote]
    assert remote and all(e.input_shapes == [] for e in remote)
    assert all(e.cpu_memory_usage == 0 for e in remote)


def test_profile_memory_travels(pool):
    """With profile_memory the callee records its allocations."""
    agent = Loopback(pool)
    with legacy(profile_memory=True) as prof:
        agent.call("sync", udf_ops, (torch.ones(64, 64),)).wait()
    remote = [e for e in prof.function_events if e.is_remote]
    assert any(e.cpu_memory_usage > 0 for e in remote)


def test_error_travels_without_events(pool):
    """On error the exception reaches the caller and no remote events do; the RPC range still ends."""
    agent = Loopback(pool)
    with legacy() as prof:
        with pytest.raises(ValueError, match="on purpose"):
            agent.call("sync", failing_udf, (torch.ones(2),)).wait()
    assert not [e for e in prof.function_events if e.is_remote]
    assert by_name(prof, "rpc_sync#failing_udf(worker0 -> worker1)")


def async_forward(agent, x):
    """Callee of the nested case: calls onward and answers from a callback on another thread."""
    inner = agent.call("async", udf_ops, (x,), dst="worker2")
    return inner.then(lambda fut: fut.wait() + 1)


def test_async_work_is_collected_when_the_response_completes(pool):
    """Nested RPCs chain keys and work finishing after the callee's function returned is included."""
    callee_agent = Loopback(pool, name="worker1")
    agent = Loopback(pool)
    with legacy(record_shapes=True) as prof:
        value = agent.call("async", async_forward, (callee_agent, torch.ones(2))).wait()
    assert torch.equal(value, torch.full((2,), 5.0))
    outer = "rpc_async#async_forward(worker0 -> worker1)"
    inner = "rpc_async#udf_ops(worker1 -> worker2)"
    event_names = names(prof)
    assert event_names.count(outer + REMOTE + inner) == 1
    assert event_names.count(outer + REMOTE + inner + REMOTE + "aten::relu") == 1
    # the +1 ran in a callback on a delivery thread, after async_forward returned
    [plus_one] = [e for e in by_name(prof, outer + REMOTE + "aten::add") if e.input_shapes == [[2], [], []]]
    assert plus_one.is_remote
    [nested] = by_name(prof, outer + REMOTE + inner)
    [rpc] = by_name(prof, outer)
    assert rpc.time_range.start <= nested.time_range.start <= nested.time_range.end <= rpc.time_range.end


def test_callbacks_on_the_callers_future_are_profiled(pool):
    """A callback on the returned future runs under the caller's profiler, as with torch's agents."""
    agent = Loopback(pool)
    with legacy(record_shapes=True) as prof:
        agent.call("async", torch.add, (torch.ones(5), 1)).then(lambda f: torch.mul(f.wait(), 3)).wait()
    assert [e for e in by_name(prof, "aten::mul") if e.input_shapes == [[5], []] and not e.is_remote]


def test_envelope_for_another_call_fails_the_call_with_a_clear_error(pool):
    """A response envelope whose profiling id is not the call's fails the user's future naming both ids."""
    with legacy():
        call = profiling.begin_call("sync", torch.add, "worker0", "worker1")
        raw = torch.futures.Future()
        user = profiling.wrap_future(call, raw)
        profiling.absorb_response(call, {"id": call.id + 1, "events": []})  # never raises into the agent
        raw.set_result(1)
        with pytest.raises(profiling.ProfilingError, match=f"{call.id + 1}.*came back for.*id={call.id}"):
            user.wait()


def test_late_events_do_not_leak_into_the_next_profile(pool):
    """Events of an RPC that completes after its profile ended are dropped, not given to the next one."""
    with legacy():
        call = profiling.begin_call("async", torch.add, "worker0", "worker1")
        raw = torch.futures.Future()
        user = profiling.wrap_future(call, raw)
    profiling.absorb_response(call, {"id": call.id, "events": [[{
        "name": "aten::add", "kind": "push", "handle": 1, "node_id": 1, "thread": 1, "fwd_thread": 0,
        "us": 0.0, "shapes": [], "stack": [], "scope": 0, "seq": -1, "async": False, "remote": False,
        "flops": 0, "cpu_mem": 0}]]})
    raw.set_result(1)
    user.wait()
    with legacy() as prof:
        torch.ones(1)
    assert not [e for e in prof.function_events if e.is_remote or e.name.startswith("rpc_")]


# ------------------------------------------------- torch's table and trace
def test_table_has_node_id_and_trace_has_remote_rows(pool, tmp_path):
    """key_averages().table() shows a Node ID column; the chrome trace has remote rows with torch's tid."""
    agent = Loopback(pool, callee_node=1)
    with legacy() as prof:
        agent.call("sync", udf_ops, (torch.ones(2),)).wait()
    remote = [e for e in prof.function_events if e.is_remote]
    assert remote and all(e.node_id == 1 for e in remote)
    assert {e.node_id for e in prof.function_events if not e.is_remote} == {-1}
    table = prof.key_averages().table(row_limit=-1)
    assert "Node ID" in table.splitlines()[1]
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())  # torch writes Chrome's JSON Array Format
    assert isinstance(events, list)
    remote_rows = [e for e in events if e.get("name", "").startswith("rpc_sync#udf_ops") and REMOTE in e["name"]]
    assert remote_rows
    for row in remote_rows:
        assert row["ph"] == "X" and row["dur"] >= 0 and "ts" in row
        assert row["tid"].startswith(" node_id:1, thread_id:") and row["tid"].endswith(" ")


# ------------------------------------------------------- the agent's own work
def test_unrecorded_hides_agent_work_and_restores_recording():
    """Work inside unrecorded() is not in the user's profile; recording resumes after it."""
    with legacy() as prof:
        with profiling.unrecorded():
            torch.zeros(4).clone()
        torch.ones(2)
    event_names = names(prof)
    assert "aten::clone" not in event_names and "aten::zeros" not in event_names
    assert "aten::ones" in event_names
    assert isinstance(profiling.unrecorded(), type(contextlib_nullcontext()))  # free without a profiler


def contextlib_nullcontext():
    import contextlib

    return contextlib.nullcontext()


def test_to_here_scope_names_self_and_owner():
    """to_here() of a user RRef is recorded as to_here#(self)->(owner) under any profiler."""
    with legacy() as prof:
        with profiling.to_here_scope("worker0", "worker1"):
            torch.ones(1)
    assert by_name(prof, "to_here#(worker0)->(worker1)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as kineto:
        with profiling.to_here_scope("worker0", "worker1"):
            torch.ones(1)
    assert "to_here#(worker0)->(worker1)" in [e.name for e in kineto.events()]


def test_request_run_inline_in_a_profiled_thread_still_gets_its_own_profile(pool):
    """run_profiled in a thread that already profiles runs the request on a fresh thread, events intact."""
    fields = {"id": 7, "state": "CPU", "record_shapes": True, "profile_memory": False}
    with legacy(record_shapes=True) as prof:
        fut = profiling.run_profiled(fields, lambda: _as_future(torch.add(torch.ones(3), 1)))
        value, envelope = fut.wait()
    assert torch.equal(value, torch.full((3,), 2.0)) and envelope["id"] == 7
    recorded = [r["name"] for records in envelope["events"] for r in records]
    assert "aten::add" in recorded
    assert not [e for e in prof.function_events if e.name == "aten::add"]  # not in the caller's own profile


def test_parity_rule_leaves_transport_out_holds_racing_groups_complete_and_the_rest_exact():
    """Rule 1: unpickling's aten::empty/aten::set_ (keyed or not) are left out of both sides, however often
    TensorPipe recorded them; rule 2: a racing call's callee group is held complete where TensorPipe delivered
    it, not compared where it lost it everywhere; rule 3: everything else exact, and TensorPipe varying on
    such an event fails the baseline instead of loosening it."""
    from collections import Counter

    import pytest

    from suites.profiling import parity

    def key(name, node=0):
        return (name, node, "[]")

    rpc, op = key("rpc_sync#f(worker0 -> worker1)"), key("rpc_sync#f#remote_op: aten::add", 1)
    unpack = [{"name": "aten::empty", "node_id": 0, "input_shapes": [[]] * 6},
              {"name": "k#remote_op: aten::set_", "node_id": 1, "input_shapes": [[0], []]}]
    assert parity.multiset(unpack * 2) == Counter()
    machinery = [{"name": "aten::cat", "node_id": 0, "input_shapes": []},
                 {"name": "aten::empty", "node_id": 0, "input_shapes": [[3]]}]
    assert parity.multiset(machinery) == Counter({key("aten::cat"): 1, ("aten::empty", 0, "[[3]]"): 1})

    exact = parity.take_baseline(iter([Counter({rpc: 1, op: 1})] * parity.SAMPLES).__next__, racing=False)
    assert parity.compare(exact, Counter({rpc: 1, op: 1})) == []
    assert [d.line() for d in parity.compare(exact, Counter({rpc: 1}))] == \
        ["'rpc_sync#f#remote_op: aten::add' node 1 shapes []: tensorpipe 1, agent 0"]
    assert [d.line() for d in parity.compare(exact, Counter({rpc: 1, op: 1, key("mine"): 1}))] == \
        ["'mine' node 0 shapes []: tensorpipe 0, agent 1"]
    with pytest.raises(parity.TensorPipeUnstable, match="rpc_sync#f\\(worker0 -> worker1\\).*counts \\[1, 2, 1, 1, 1\\]"):
        parity.take_baseline(iter([Counter({rpc: 1, op: 1}), Counter({rpc: 2, op: 1})] + [Counter({rpc: 1, op: 1})] * 3
                                  ).__next__, racing=False)  # a caller event is exact
    # a request's group lost whole (a reused worker thread) is taken from the samples that delivered it
    reused = parity.take_baseline(iter([Counter({rpc: 1, op: 1}), Counter({rpc: 1})] + [Counter({rpc: 1, op: 1})] * 3
                                       ).__next__, racing=False)
    assert reused.lost_in == 1 and reused.callee == Counter({op: 1})
    assert [d.line() for d in parity.compare(reused, Counter({rpc: 1}))] == \
        ["'rpc_sync#f#remote_op: aten::add' node 1 shapes []: tensorpipe 1, agent 0"]  # the agent must still send it
    # ...but where delivered, a non-racing group must be whole: a partial one is no loss the rule knows
    mul = key("rpc_sync#f#remote_op: aten::mul", 1)
    with pytest.raises(parity.TensorPipeUnstable, match="callee events of 'rpc_sync#f'.*aten::mul.*counts \\[1, 0, 1, 1, 1\\]"):
        parity.take_baseline(iter([Counter({rpc: 1, op: 1, mul: 1}), Counter({rpc: 1, op: 1})]
                                  + [Counter({rpc: 1, op: 1, mul: 1})] * 3).__next__, racing=False)
    # a nested request is a group of its own: its loss leaves the outer group compared
    nested = key("rpc_sync#f#remote_op: rpc_async#g(worker1 -> worker2)#remote_op: aten::add", 2)
    chain = parity.take_baseline(iter([Counter({rpc: 1, op: 1, nested: 1}), Counter({rpc: 1, op: 1})]
                                      + [Counter({rpc: 1, op: 1, nested: 1})] * 3).__next__, racing=False)
    assert chain.lost_in == 1 and chain.callee == Counter({op: 1, nested: 1})

    racing = parity.take_baseline(iter([Counter({rpc: 1})] * 3 + [Counter({rpc: 1, op: 1})] * 2).__next__, racing=True)
    assert racing.lost_in == 3 and racing.callee == Counter({op: 1})
    assert parity.compare(racing, Counter({rpc: 1, op: 1})) == []
    assert [d.line() for d in parity.compare(racing, Counter({rpc: 1}))] == \
        ["'rpc_sync#f#remote_op: aten::add' node 1 shapes []: tensorpipe 1, agent 0"]  # dropping the group fails
    lost = parity.take_baseline(iter([Counter({rpc: 1})] * parity.SAMPLES).__next__, racing=True)
    assert not lost.callee_compared and parity.compare(lost, Counter({rpc: 1, op: 1})) == []
    assert parity.compare(lost, Counter({rpc: 2})) != []  # the RPC's own event stays exact
