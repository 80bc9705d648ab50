"""Seeded bug: the reference RPC pickler sends an nn.Parameter as a plain tensor.

``type(rpc_sync(w, make_linear).weight)`` is ``Tensor`` where torch gives
``Parameter``: the pickler's dispatch table reduces Parameter with the
tensor reducer instead of letting Parameter's own ``__reduce_ex__`` wrap its
data (what the reference agents did before). Caught by the Parameter
clause.
"""

import torch

from backends.reference.rpc import serialize
from tests.seeded.gloo_wrapper import register
from tests.seeded.rpc_base import RpcBugHost


# BUG: a Parameter pickles through the tensor reducer and arrives as a torch.Tensor
serialize.register_reducer(torch.nn.Parameter, serialize._tensor_reducer)

DISTCONFORM_SPEC = register("rpc_parameter_as_tensor", RpcBugHost)
