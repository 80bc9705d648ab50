"""Seeded bug: the reference callee runs a builtin's name as the first callable torch's table lists under it.

``torch.jit._builtins._builtin_ops`` lists math.cos before torch.cos under
"aten::cos" (34 names like it), so ``rpc_sync(w, torch.cos, (ones(3),))``
raises "only one element tensors can be converted to Python scalars" and a
one-element tensor silently comes back as a Python float. The reference
agents did exactly this before builtins resolved to the aten operator.
Caught by the builtin clause: torch runs the operator.
"""

import torch

from backends.reference.rpc import builtin_ops
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _first_listed(original):
    def resolve(name):
        for fn, listed in torch.jit._builtins._builtin_ops:
            if listed == name:
                return fn  # BUG: math.cos for "aten::cos", whatever the arguments
        return original(name)
    return resolve


DISTCONFORM_SPEC = plant_in("rpc_builtin_resolves_math", builtin_ops, "resolve", _first_listed, RpcBugHost)
