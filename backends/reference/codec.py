"""What every reference wire format shares: the dtype table, tensor descriptors, the protocol error.

Three formats use it: the c10d reference backend's frames (``wire.py``,
dtypes by name in JSON), reference-tp's (``rpc/tp_codec.py``, a packed
descriptor with sizes and strides) and reference-pg's (``rpc/pg_codec.py``,
int64 descriptor words). How each packs a descriptor is its own; which
dtypes exist, what code each has, how a tensor becomes bytes and which
frame headers, lengths and descriptors are believed is decided here, once, so the three carry the same
dtypes and refuse the same lies.

Nothing here trusts its input: a descriptor read from a peer is checked
before anything is allocated, and every violation is a ProtocolError whose
text names the field (the caller adds the peer).
"""

from __future__ import annotations

from collections.abc import Container

import torch


class ProtocolError(Exception):
    """Bytes that are not a valid frame of a reference protocol; the peer that sent them is dropped."""


# ------------------------------------------------------------------ dtypes
# Wire codes of dtypes: a code is an index here. Append only, never reorder; names
# missing from this torch build are skipped without shifting the others.
DTYPE_TABLE = (
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128",
    "uint8", "int8", "int16", "int32", "int64", "bool", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
)
CODE_DTYPES: dict[int, torch.dtype] = {
    code: getattr(torch, name) for code, name in enumerate(DTYPE_TABLE) if hasattr(torch, name)
}
DTYPE_CODES: dict[torch.dtype, int] = {dtype: code for code, dtype in CODE_DTYPES.items()}
DTYPES: dict[str, torch.dtype] = {DTYPE_TABLE[code]: dtype for code, dtype in CODE_DTYPES.items()}
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}
ITEMSIZE: dict[int, int] = {code: dtype.itemsize for code, dtype in CODE_DTYPES.items()}

MAX_DIMS = 16
MAX_SIZE = 1 << 40  # one dimension: anything larger is a garbled field, not a tensor
MAX_TENSOR_BYTES = 1 << 36  # 64 GiB


def supported() -> str:
    return ", ".join(DTYPES)


# ------------------------------------------------------------------ encoding
def _plain(tensor, index: int, carrier: str) -> torch.Tensor:
    """``tensor`` without autograd history or pending conj/neg bits; raises naming what ``carrier`` cannot carry."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"frame tensor {index} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.device.type != "cpu":
        raise ValueError(f"frame tensor {index} is on {tensor.device}; the {carrier} transport carries "
                         "CPU tensors only (move it to the CPU first)")
    if tensor.layout != torch.strided:
        raise ValueError(f"frame tensor {index} has layout {tensor.layout}; only dense (strided) tensors travel")
    if tensor.dtype not in DTYPE_CODES:
        raise ValueError(f"frame tensor {index} has dtype {tensor.dtype}, which the {carrier} transport "
                         f"cannot carry; supported: {supported()}")
    # Each step only when needed: this runs for every tensor of every frame.
    flat = tensor.detach() if tensor.requires_grad else tensor
    # A conjugated or negated view keeps its pending bit through a copy: resolve it,
    # or the receiver gets the un-conjugated values.
    if flat.is_conj():
        flat = flat.resolve_conj()
    if flat.is_neg():
        flat = flat.resolve_neg()
    return flat


def tensor_payload(tensor, index: int, carrier: str) -> torch.Tensor:
    """The tensor's elements as a flat contiguous uint8 tensor (a view when already contiguous).

    Raises TypeError/ValueError naming tensor ``index`` and what ``carrier`` cannot
    carry: not a tensor, not on the CPU, not dense, a dtype without a wire code.
    """
    flat = _plain(tensor, index, carrier).reshape(-1)  # a view when contiguous, else a contiguous copy
    if flat.stride(0) != 1:
        # torch calls a view with one element (or size-1 dims, or none) contiguous whatever
        # its strides, and reshape keeps such a stride: copy to get unit stride (an empty
        # strided slice too, or view(torch.uint8) refuses it)
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


# torch's kMinRecopyBytes and kMinMultiple (torch/csrc/distributed/rpc/utils.cpp, cloneSparseTensors)
RECOPY_MIN_BYTES = 8 * 1024
RECOPY_MIN_MULTIPLE = 2


def strided_payload(tensor, index: int, carrier: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(the memory the tensor's elements span as flat uint8, its strides): a tensor as torch's RPC sends it.

    TensorPipe sends a tensor's storage and its strides, so a transposed, permuted,
    channels_last or expanded tensor arrives with the strides it had, unless the
    storage is at least 8 KiB and twice the tensor's elements: then it sends
    ``clone()`` (dense, same stride order). The span from the first to the last
    element stands in for the whole storage: the strides that arrive are torch's,
    the storage offset starts at 0. Raises as ``tensor_payload``.
    """
    flat = _plain(tensor, index, carrier)
    if not flat.numel():
        return torch.empty(0, dtype=torch.uint8), tuple(flat.stride())
    useful = flat.numel() * flat.element_size()
    storage = flat.untyped_storage().nbytes()
    if storage >= RECOPY_MIN_BYTES and storage >= RECOPY_MIN_MULTIPLE * useful:
        flat = flat.clone()  # preserve_format: a dense tensor keeps its strides, a sparse view its stride order
    strides = tuple(flat.stride())
    span = 1 + sum((size - 1) * stride for size, stride in zip(flat.shape, strides))
    return flat.as_strided((span,), (1,)).view(torch.uint8), strides


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's elements as bytes, without a copy when it is already contiguous."""
    flat = tensor_payload(tensor, 0, "reference")
    return memoryview(flat.numpy()) if flat.numel() else memoryview(b"")


# ------------------------------------------------------------------ validation
def check_frame_header(magic: bytes, version: int, kind: int, *, expected_magic: bytes, expected_version: int,
                       kinds: Container[int]) -> None:
    """The magic, version and kind of a frame header read from a peer, or ProtocolError naming the first one wrong."""
    if magic != expected_magic:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != expected_version:
        raise ProtocolError(f"unsupported protocol version {version}")
    if kind not in kinds:
        raise ProtocolError(f"unknown frame kind {kind}")


def check_length(what: str, length: int, limit: int) -> None:
    """A byte count read from a peer, believed up to ``limit``: ProtocolError ("<what> of N bytes exceeds L") past it."""
    if length > limit:
        raise ProtocolError(f"{what} of {length} bytes exceeds {limit}")


def check_descriptor(code, shape, *, strides=None, nbytes: int | None = None, max_dims: int = MAX_DIMS,
                     max_bytes: int = MAX_TENSOR_BYTES) -> tuple[torch.dtype, int]:
    """(dtype, bytes of storage the descriptor needs) of a descriptor read from a peer, or ProtocolError.

    ``shape`` (and ``strides``, when the format carries them; contiguous otherwise)
    must be non-negative ints, each below ``MAX_SIZE``; the storage they reach must
    stay within ``max_bytes`` and, when the format states it, equal ``nbytes``.
    """
    if isinstance(code, bool) or not isinstance(code, int) or code not in CODE_DTYPES:
        raise ProtocolError(f"unknown dtype code {code!r}")
    dtype, itemsize = CODE_DTYPES[code], ITEMSIZE[code]
    if not isinstance(shape, (list, tuple)) or len(shape) > max_dims:
        size = len(shape) if isinstance(shape, (list, tuple)) else shape
        raise ProtocolError(f"tensor of {size!r} dims (at most {max_dims})")
    if nbytes is not None:
        check_length("tensor", nbytes, max_bytes)
        if nbytes % itemsize:
            raise ProtocolError(f"{nbytes} bytes is not a whole number of {dtype} elements")
    dims = list(shape) + (list(strides) if strides is not None else [])
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ProtocolError(f"bad shape {list(shape)!r}" + (f", strides {list(strides)!r}" if strides else ""))
    if any(d < 0 for d in dims):
        raise ProtocolError(f"negative size or stride: sizes {list(shape)}"
                            + (f", strides {list(strides)}" if strides is not None else ""))
    if any(d >= MAX_SIZE for d in shape):
        raise ProtocolError(f"bad shape {list(shape)}: a size of {MAX_SIZE} or more")
    if strides is None:  # contiguous: the storage is the elements
        extent = 1
        for size in shape:
            extent *= size
            if extent * itemsize > max_bytes:
                raise ProtocolError(f"a {dtype} tensor of shape {list(shape)} exceeds {max_bytes} bytes")
        described = f"shape {list(shape)}"
    else:
        if len(strides) != len(shape):
            raise ProtocolError(f"{len(shape)} sizes with {len(strides)} strides")
        extent = 0 if any(size == 0 for size in shape) else 1
        if extent:
            for size, stride in zip(shape, strides):
                extent += (size - 1) * stride
                if extent * itemsize > max_bytes:
                    raise ProtocolError(f"sizes {list(shape)} with strides {list(strides)} reach past any tensor")
        described = f"sizes {list(shape)}, strides {list(strides)}"
    if nbytes is not None and extent * itemsize != nbytes:
        raise ProtocolError(f"{nbytes} data bytes for a {dtype} tensor of {described} "
                            f"({extent * itemsize} expected)")
    return dtype, extent * itemsize


def empty(shape, dtype: torch.dtype, strides=None) -> torch.Tensor:
    """The tensor of a checked descriptor without elements; ProtocolError when its strides overflow int64."""
    try:
        if strides is None:
            return torch.empty(shape, dtype=dtype)
        return torch.empty_strided(shape, strides, dtype=dtype)
    except RuntimeError as exc:  # no elements, but dimensions whose strides overflow int64
        raise ProtocolError(f"bad shape {list(shape)!r}: {exc}") from None
