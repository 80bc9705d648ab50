"""Contract: a profiled distributed backward shows its range and the send and recv functions it ran.

Under ``torch.autograd.profiler.profile()`` on the caller, ``backward``
records one ``torch::distributed::autograd::backward`` range, and the send
and recv functions it executes there appear as ``SendRpcBackward`` and
``RecvRpcBackward`` events, one per node it ran (torch's own node names
carry the ``torch::distributed::autograd::`` prefix; the reference's engine
also shows "autograd::engine::evaluate_function: ..." wrappers, not
counted), inside that range's time
(torch's test_dist_autograd_profiling; spec B13).
"""

import re

import torch

from suites.dist_autograd.common import RECV_NODE_NAME, SEND_NODE_NAME, add, autograd, leaves, peer_name, rpc

BACKWARD_RANGE = "torch::distributed::autograd::backward"


# ---------------------------------------------------------------- rank side
def profiled_backward():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), add, args=(t1, t2)).sum()
        with torch.autograd.profiler.profile() as prof:
            mod.backward(context_id, [loss])
    found = {}
    for key, name in (("SendRpcBackward", SEND_NODE_NAME), ("RecvRpcBackward", RECV_NODE_NAME),
                      (BACKWARD_RANGE, re.compile(re.escape(BACKWARD_RANGE) + "$"))):
        events = [e for e in prof.function_events if name.match(e.name)]  # node events, not the engine's wrappers
        found[key] = (len(events), max((e.cpu_time_total for e in events), default=0.0))
    return found


# ---------------------------------------------------------------- clauses
def test_profiled_backward_records_its_range_and_send_and_recv_functions(rpc_agent):
    """A profiled backward on the caller records the torch::distributed::autograd::backward range and the SendRpcBackward and RecvRpcBackward it ran."""
    for rank, found in enumerate(rpc_agent.run(profiled_backward)):
        counts = {key: count for key, (count, _) in found.items()}
        assert counts == {"SendRpcBackward": 1, "RecvRpcBackward": 1, BACKWARD_RANGE: 1}, \
            f"rank {rank}: events per name {counts}"
        backward_total = found[BACKWARD_RANGE][1]
        assert all(backward_total > found[key][1] for key in ("SendRpcBackward", "RecvRpcBackward")), \
            f"rank {rank}: the backward range ({backward_total} us) does not enclose the send/recv functions {found}"
