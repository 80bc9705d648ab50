"""Contract: what the legacy profiler shows of a remote call (torch 2.13, checked on every agent).

The caller records ``rpc_{sync|async|remote}#{name}({src} -> {dst})`` (node
id = the caller's rank) and gets the callee's events renamed
``key#remote_op: op`` with the callee's node id, inside the caller's RPC
interval (one host, one clock). record_shapes and profile_memory travel to
the callee: remote input shapes equal the same op profiled locally, and are
empty without record_shapes; remote memory is zero without profile_memory.
Nested RPCs chain keys. A failing call brings its exception and no remote
events. The Kineto profiler (torch.profiler.profile) profiles only the
caller. The user's own table shows a Node ID column and the chrome trace
puts remote events on rows named " node_id:<n>, thread_id:<t> "; the trace of
the nested workload goes to ``<report-dir>/profiling/`` and must open in
Perfetto. TensorPipe runs these clauses in the baseline world (conftest.py).
"""

import json

import pytest
import torch

from suites.profiling import capture, parity
from suites.profiling.workloads import CONCURRENT, MODES, NESTED, WORKLOADS
from suites.rpc.call_modes import CALLS, RPC_ASYNC, RPC_SYNC, exec_mode_of

REMOTE = "#remote_op: "
DIRECT = [name for name in WORKLOADS if name != NESTED]
SUCCEEDING = [name for name in WORKLOADS if not WORKLOADS[name].raises]
TOLERANCE_US = 1.0  # the legacy profiler's clock ticks are microseconds; parsing rounds
# The clauses that read the callee's events of a profiled request: TensorPipe itself loses them now and then
# (a worker thread profiles only the first profiled request it serves: suites/profiling/parity.py, rule 2), its gap.
CALLEE_EVENTS = pytest.mark.needs(rpc_feature="profiled_callee_events")


def key_of(workload: str, rpc_call: str) -> str:
    """The RPC event's name for a workload: torch's _build_rpc_profiling_key over its function's name."""
    from torch.distributed.rpc.internal import RPCExecMode, _build_rpc_profiling_key

    work = WORKLOADS[workload]
    func_name = torch.jit._builtins._find_builtin(work.func) or work.func.__qualname__
    return _build_rpc_profiling_key(RPCExecMode(exec_mode_of(rpc_call)), func_name, "worker0", f"worker{work.dst}")


def profile(agent, workload, rpc_call, **options):
    return agent.run(capture.profile_workload, agent.name, workload, rpc_call, warmup=1, **options)[0]


def remote_events(out):
    return [e for e in out["events"] if e["is_remote"]]


@CALLEE_EVENTS
@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
def test_rpc_event_and_remote_events_are_named_by_torchs_key(profiled_agent, rpc_call):
    """torch.add on worker1: "rpc_<mode>#aten::add(worker0 -> worker1)" on node 0 and "<key>#remote_op: aten::add" on node 1."""
    out = profile(profiled_agent, "builtin_add", rpc_call)
    key = f"rpc_{exec_mode_of(rpc_call)}#aten::add(worker0 -> worker1)"
    rpc = [e for e in out["events"] if e["name"] == key]
    assert [(e["node_id"], e["is_remote"]) for e in rpc] == [(0, False)], out["events"]
    adds = [e for e in out["events"] if e["name"] == key + REMOTE + "aten::add"]
    assert [(e["node_id"], e["is_remote"]) for e in adds] == [(1, True)]
    for evt in remote_events(out):
        assert evt["name"].startswith(key + REMOTE) and evt["node_id"] == 1, evt
    if CALLS[rpc_call].wait_method == "to_here":  # remote(): the caller's to_here is profiled too
        assert [e["node_id"] for e in out["events"] if e["name"] == "to_here#(worker0)->(worker1)"] == [0]


@CALLEE_EVENTS
def test_python_function_key_is_its_qualname(profiled_agent):
    """A Python function's key uses its __qualname__: rpc_async#udf_several_ops(worker0 -> worker1)#remote_op: aten::mul."""
    out = profile(profiled_agent, "python_udf", RPC_ASYNC.name)
    names = [e["name"] for e in remote_events(out)]
    assert "rpc_async#udf_several_ops(worker0 -> worker1)" + REMOTE + "aten::mul" in names
    assert "rpc_async#udf_several_ops(worker0 -> worker1)" + REMOTE + "aten::relu" in names


@CALLEE_EVENTS
@pytest.mark.min_world_size(3)
@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
def test_nested_rpcs_chain_keys_with_each_workers_node_id(profiled_agent, rpc_call):
    """@async_execution on worker1 calling worker2: one "<outer>#remote_op: <inner>" (node 1), one "...#remote_op: aten::add" (node 2)."""
    out = profile(profiled_agent, NESTED, rpc_call)
    outer = f"rpc_{exec_mode_of(rpc_call)}#async_add(worker0 -> worker1)"
    inner = "rpc_async#slow_add(worker1 -> worker2)"
    chained = [e["node_id"] for e in out["events"] if e["name"] == outer + REMOTE + inner]
    innermost = [e["node_id"] for e in out["events"] if e["name"] == outer + REMOTE + inner + REMOTE + "aten::add"]
    assert chained == [1] and innermost == [2], [e["name"] for e in out["events"]]
    # the +1 ran in a callback after async_add returned: async work is part of the answer
    assert [e for e in remote_events(out)
            if e["name"] == outer + REMOTE + "aten::add" and e["input_shapes"] == [[2], [], []]]


@CALLEE_EVENTS
@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
@pytest.mark.parametrize("workload", ["builtin_add", "builtin_mul", "python_udf"])
def test_remote_input_shapes_equal_the_same_ops_profiled_locally(profiled_agent, workload, rpc_call):
    """With record_shapes the callee's ops and their input shapes are those of the function profiled locally."""
    out = profile(profiled_agent, workload, rpc_call, record_shapes=True)
    local = profiled_agent.run(capture.profile_locally, workload)[0]
    key = key_of(workload, rpc_call)
    remote = sorted((e["name"][len(key + REMOTE):], json.dumps(e["input_shapes"]))
                    for e in remote_events(out) if e["name"].startswith(key + REMOTE))
    here = sorted((e["name"], json.dumps(e["input_shapes"])) for e in local)
    assert remote == here


@CALLEE_EVENTS
@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
@pytest.mark.parametrize("workload", SUCCEEDING)
def test_remote_intervals_lie_inside_the_callers_rpc_event(profiled_agent, workload, rpc_call):
    """Every remote event's interval lies inside the interval of the caller's RPC event it belongs to."""
    if WORKLOADS[workload].min_world_size > profiled_agent.world_size:
        pytest.skip(f"{workload} needs world size >= {WORKLOADS[workload].min_world_size}")
    out = profile(profiled_agent, workload, rpc_call)
    rpcs = {e["name"]: e for e in out["events"] if not e["is_remote"] and e["name"].startswith("rpc_")}
    remote = remote_events(out)
    assert rpcs and remote, [e["name"] for e in out["events"]]
    for evt in remote:
        rpc = rpcs[evt["name"].split(REMOTE)[0]]
        assert rpc["start_us"] - TOLERANCE_US <= evt["start_us"] <= evt["end_us"] <= rpc["end_us"] + TOLERANCE_US, \
            (evt["name"], (evt["start_us"], evt["end_us"]), (rpc["start_us"], rpc["end_us"]))


@CALLEE_EVENTS
@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
def test_without_record_shapes_remote_shapes_are_empty(profiled_agent, rpc_call):
    """Without record_shapes every remote event's input shapes are empty."""
    out = profile(profiled_agent, "python_udf", rpc_call, record_shapes=False)
    assert remote_events(out)
    assert [e["name"] for e in remote_events(out) if e["input_shapes"]] == []


@CALLEE_EVENTS
def test_profile_memory_travels_and_is_zero_without_it(profiled_agent):
    """profile_memory reaches the callee (non-zero remote memory); without it remote memory is zero."""
    with_memory = profile(profiled_agent, "python_udf", RPC_SYNC.name, profile_memory=True)
    without = profile(profiled_agent, "python_udf", RPC_SYNC.name, profile_memory=False)
    assert any(e["cpu_memory_usage"] != 0 for e in remote_events(with_memory))
    assert remote_events(without) and all(e["cpu_memory_usage"] == 0 for e in remote_events(without))


@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
def test_kineto_profiler_records_no_remote_events(profiled_agent, rpc_call):
    """Under torch.profiler.profile (Kineto) no "rpc_" event and no "#remote_op: " event is recorded."""
    out = profile(profiled_agent, "python_udf", rpc_call, profiler="kineto")
    names = [e["name"] for e in out["events"]]
    assert "aten::zeros" in names, f"the Kineto profile recorded nothing: {names}"
    assert [n for n in names if n.startswith("rpc_") or REMOTE in n] == []


@pytest.mark.parametrize("rpc_call", (RPC_SYNC.name, RPC_ASYNC.name), ids=exec_mode_of)
def test_failing_call_brings_its_error_and_no_remote_events(profiled_agent, rpc_call):
    """A request that fails on the callee (torch.add of shapes [2] and [3]): the error arrives, no remote events do.

    (A Python function that raises is not such a failure for TensorPipe: its
    exception travels back as the call's value, with the remote events.)
    """
    out = profiled_agent.run(capture.profile_failing_call, profiled_agent.name, rpc_call)[0]
    assert out["error"] and "must match the size" in out["error"], out["error"]
    assert [e["name"] for e in out["events"] if e["is_remote"] or REMOTE in e["name"]] == []


@CALLEE_EVENTS
def test_table_has_node_ids_and_trace_opens_in_perfetto(profiled_agent, parity_report):
    """key_averages().table() has a Node ID column; export_chrome_trace() is valid trace JSON with remote rows."""
    nested = profiled_agent.world_size >= WORKLOADS[NESTED].min_world_size
    workload = NESTED if nested else "python_udf"
    path = parity_report.trace_path(f"trace_{workload}_{profiled_agent.name}_ws{profiled_agent.world_size}.json")
    out = profiled_agent.run(capture.profile_workload, profiled_agent.name, workload, RPC_SYNC.name, warmup=1,
                             table=True, trace_path=path)[0]
    header = out["table"].splitlines()[1]
    assert "Node ID" in header, out["table"]
    assert parity.check_chrome_trace(out["trace"]) == []
    remote_rows = [e for e in out["trace"] if REMOTE in e["name"]]
    assert remote_rows
    for row in remote_rows:
        assert row["tid"].startswith(" node_id:") and ", thread_id:" in row["tid"], row
        assert row["pid"] == "CPU functions"
    nodes = {row["tid"].split(",")[0].strip() for row in remote_rows}
    assert nodes == ({"node_id:1", "node_id:2"} if nested else {"node_id:1"})


@pytest.mark.needs(workload=CONCURRENT)
def test_concurrent_calls_each_bring_their_own_events(profiled_agent):
    """8 profiled rpc_async calls in flight at once: 8 of each remote op come back (none lost or mixed up).

    (The RPC events themselves are not counted: torch's parser drops a push
    that directly follows a push of the same name on one thread, so calls
    issued back to back show as fewer rpc_async events, with TensorPipe too.)
    """
    count = 8
    events = profiled_agent.run(capture.profile_concurrent_calls, profiled_agent.name, count)[0]
    key = "rpc_async#udf_several_ops(worker0 -> worker1)"
    assert key in [e["name"] for e in events]
    counts = {op: [e["node_id"] for e in events if e["name"] == key + REMOTE + op]
              for op in ("aten::add", "aten::mul", "aten::sub", "aten::relu")}
    wrong = {op: nodes for op, nodes in counts.items() if nodes != [1] * count}
    assert not wrong, ", ".join(f"{op} {len(nodes)}/{count}" for op, nodes in counts.items()) + \
        " calls brought their remote op back" + "".join(f"; {op} from nodes {nodes}" for op, nodes in wrong.items())
