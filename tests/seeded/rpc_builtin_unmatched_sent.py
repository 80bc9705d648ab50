"""Seeded bug: the reference caller sends a builtin call whose arguments no schema of the operator takes.

torch's caller matches a builtin's arguments against its operator's schemas
before sending and raises RuntimeError("Overloaded torch operator invoked
from Python failed to match any schema:") there; with the check gone,
``rpc_sync(w, torch.ones, (3,))`` reaches the callee and fails remotely with
another text (or, for a builtin without an operator, with "Unknown builtin
operator"). Caught by the builtin clause's refused calls.
"""

from backends.reference.rpc import builtin_ops
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _no_match(original):
    def check_arguments(name, args, kwargs):
        return None  # BUG: every call is sent, whatever its arguments
    return check_arguments


DISTCONFORM_SPEC = plant_in("rpc_builtin_unmatched_sent", builtin_ops, "check_arguments", _no_match, RpcBugHost)
