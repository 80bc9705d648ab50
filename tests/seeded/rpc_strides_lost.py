"""Seeded bug: reference-tp sends every tensor row-major, so a transpose arrives contiguous.

``ones(2, 3).t()`` arrives with strides (2, 1) where torch keeps (1, 3): the
frame carries the elements in row-major order with row-major strides (what
both reference agents did before tensors travelled with their strides).
Values and shapes are right, so only a clause that looks at strides sees it.
"""

import torch

from backends.reference import codec
from backends.reference.rpc import tp_codec
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _row_major(original):
    def strided_payload(tensor, index, carrier):
        # BUG: the elements in row-major order, described with row-major strides
        return codec.tensor_payload(tensor, index, carrier), tuple(torch.empty(tensor.shape, device="meta").stride())
    return strided_payload


DISTCONFORM_SPEC = plant_in("rpc_strides_lost", tp_codec, "strided_payload", _row_major, RpcBugHost)
