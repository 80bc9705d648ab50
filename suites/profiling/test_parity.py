"""Contract: profiling an RPC under the legacy profiler shows the same events on every agent as on TensorPipe.

torch 2.13 profiles remote work only under torch.autograd.profiler_legacy
(rpc.api._get_should_profile). For each workload (builtin add and mul, a
Python function doing several ops, a TorchScript function, a call to self,
an @async_execution function calling a third worker, a Python function that
raises) and each way of calling
it (rpc_sync, rpc_async, remote + to_here), the caller's profile, as the
multiset of (event name, node id, input shapes) with record_shapes on, is
exactly TensorPipe's: the RPC's own event
``rpc_{mode}#{name}({src} -> {dst})``, every op the callee ran renamed
``key#remote_op: op`` with the callee's node id, nested RPCs chained, the
``to_here#(self)->(owner)`` event, and nothing of the agent's own machinery.
Times and thread ids are not compared. What of TensorPipe's profile belongs
to the contract is decided by rule (suites/profiling/parity.py): its
transport work (unpickling the response's tensors) is left out, the
callee's events of a call whose continuation races in TensorPipe are held
to TensorPipe's complete profile, everything else is exact. The per-agent
table goes to ``<report-dir>/profiling/parity.md``.
"""

import pytest

from suites.profiling import capture, parity
from suites.profiling.workloads import MODES, NESTED, WORKLOADS, known_deviation
from suites.rpc.call_modes import exec_mode_of

DIRECT = [name for name in WORKLOADS if name != NESTED]


def check_parity(request, rpc_agent, tensorpipe_baseline, parity_report, workload: str, rpc_call: str):
    if rpc_agent.name == "tensorpipe":
        pytest.skip("tensorpipe is the baseline: its own samples define the expected events")
    deviation = known_deviation(rpc_agent.name, workload, rpc_call)  # a gap: mark_gap already made it an xfail
    expected = tensorpipe_baseline.get(rpc_agent.world_size, workload, rpc_call, record_shapes=True)
    out = rpc_agent.run(capture.profile_workload, rpc_agent.name, workload, rpc_call, record_shapes=True, warmup=1)[0]
    diffs = parity.compare(expected, parity.multiset(out["events"]))
    target = f"{rpc_agent.world.spec.name}-ws{rpc_agent.world_size}"
    mode = exec_mode_of(rpc_call)  # the parity table's column
    parity_report.add(parity.ParityRow(target, rpc_agent.name, workload, mode, not diffs, expected.samples,
                                       [d.line() for d in diffs], deviation or "",
                                       callee_lost_in=expected.lost_in if expected.racing else None,
                                       agent_transport_events=parity.transport_events(out["events"])))
    assert not diffs, (f"{rpc_agent.name} {workload} {mode}: {len(diffs)} events differ from TensorPipe's\n"
                       + "\n".join(d.line() for d in diffs))


@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
@pytest.mark.parametrize("workload", DIRECT)
def test_events_match_tensorpipe(request, rpc_agent, tensorpipe_baseline, parity_report, workload, rpc_call):
    """A profiled RPC's events (name, node id, input shapes, count) are exactly TensorPipe's."""
    check_parity(request, rpc_agent, tensorpipe_baseline, parity_report, workload, rpc_call)


@pytest.mark.min_world_size(3)
@pytest.mark.parametrize("rpc_call", MODES, ids=exec_mode_of)
@pytest.mark.needs(workload=NESTED)
def test_nested_async_events_match_tensorpipe(request, rpc_agent, tensorpipe_baseline, parity_report, rpc_call):
    """An @async_execution function calling a third worker: chained keys, node ids and async work as TensorPipe."""
    check_parity(request, rpc_agent, tensorpipe_baseline, parity_report, NESTED, rpc_call)
