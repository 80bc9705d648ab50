"""Property test: both reference RPC codecs deliver a tensor with the strides torch's RPC gives it.

torch sends a tensor's storage with its strides, or its clone() when the
storage is at least 8 KiB and twice its elements (cloneSparseTensors in
torch/csrc/distributed/rpc/utils.cpp). hypothesis draws shapes, permutations,
expands, slices with steps and offsets, small and large storages; each tensor
goes through reference-tp's and reference-pg's encode and decode (no wire) and
must come out with the same values and torch's strides.
"""

from __future__ import annotations

import io

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.reference.rpc import pg_codec, tp_codec
from backends.reference.rpc.transport import Frame, Kind
from tests.rpc_cases.transport_fns import torch_rpc_strides


@st.composite
def views(draw) -> torch.Tensor:
    ndim = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim))
    scale = draw(st.sampled_from([1, 40]))  # 40: storages past torch's 8 KiB recopy threshold
    base = torch.arange(float(scale * torch.Size(shape).numel())).reshape(scale * shape[0], *shape[1:])
    view = base[draw(st.integers(0, scale - 1))::scale] if scale > 1 and draw(st.booleans()) else base[:shape[0]]
    view = view.permute(*draw(st.permutations(range(ndim))))
    if draw(st.booleans()):  # a stepped slice along one dim: not dense any more
        index = [slice(None)] * ndim
        index[draw(st.integers(0, ndim - 1))] = slice(None, None, 2)
        view = view[tuple(index)]
    if draw(st.booleans()):  # an expanded leading dim: stride 0
        view = view.unsqueeze(0).expand(draw(st.integers(1, 3)), *view.shape)
    return view


def _through_tp(tensor: torch.Tensor) -> torch.Tensor:
    parts = tp_codec.encode(Frame(int(Kind.PYTHON_CALL), 1, b"h", [tensor]))
    stream = io.BufferedReader(io.BytesIO(b"".join(bytes(p) for p in parts)))
    return tp_codec.read_frame(stream).tensors[0]


def _through_pg(tensor: torch.Tensor) -> torch.Tensor:
    meta, body, datas = pg_codec.encode(Frame(int(Kind.PYTHON_CALL), 1, b"h", [tensor]))
    rest = ([body] if body is not None else []) + list(datas)
    return pg_codec.read_frame(meta.numpy().tobytes(), 1, lambda nbytes: rest.pop(0).clone()).tensors[0]


@settings(max_examples=300, deadline=None)
@given(views())
def test_codecs_deliver_torchs_strides(tensor):
    """reference-tp and reference-pg frames carry a view with torch's strides and its values."""
    want = torch_rpc_strides(tensor)
    for through in (_through_tp, _through_pg):
        got = through(tensor)
        assert tuple(got.stride()) == want, f"{through.__name__}: {tuple(tensor.shape)} strides " \
                                            f"{tensor.stride()} arrived as {got.stride()}, torch gives {want}"
        assert torch.equal(got, tensor), f"{through.__name__}: values differ for strides {tensor.stride()}"
