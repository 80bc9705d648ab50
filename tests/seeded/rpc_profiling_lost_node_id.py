"""Seeded bug: remote events lose the callee's node id and show the caller's.

The caller renames a callee's records and re-stamps them with its own node
id, as if the ops had run locally. Caught by the node-id clauses and by
parity with TensorPipe (every remote event's node id differs).
"""

from backends.reference.rpc import profiling
from tests.seeded.rpc_profiling_base import plant_in_profiling


def _local_node(clean):
    def remote_record_local_node(record, prefix):
        return dict(clean(record, prefix), node_id=profiling.node_id())  # BUG: the caller's node id
    return remote_record_local_node


DISTCONFORM_SPEC = plant_in_profiling("rpc_profiling_lost_node_id", "remote_record", _local_node,
                                      __doc__.strip().splitlines()[0])
