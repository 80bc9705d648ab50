"""The reference backend's wire format: one frame per message, checked field by field.

    header   magic "DCRF" | version u8 | kind u8 | 2 pad bytes | tag i64 | meta_len u32 | data_len u64
    meta     meta_len bytes of UTF-8 JSON (an object): small, self-describing fields
    data     data_len raw bytes: a tensor's storage, never pickled

Nothing read from a socket is ever unpickled or trusted: every field is
validated and any violation raises ProtocolError, which the transport turns
into a refused connection with an error, never a crash or a hang.
"""

from __future__ import annotations

import json
import struct

import torch

MAGIC = b"DCRF"
VERSION = 1
HEADER = struct.Struct("!4sBBxxqIQ")
MAX_META = 1 << 16
MAX_DATA = 1 << 36  # 64 GiB: anything larger is a garbled length, not a tensor

HELLO, P2P, COLL = 1, 2, 3
KINDS = {HELLO: "hello", P2P: "p2p", COLL: "collective"}

DTYPES = {
    name: getattr(torch, name)
    for name in ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
                 "uint8", "bool", "complex64", "complex128")
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_DIMS = 16


class ProtocolError(Exception):
    """A frame that is not a valid frame of this protocol."""


def encode_header(kind: int, tag: int, meta: bytes, data_len: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, tag, len(meta), data_len)


def decode_header(raw: bytes) -> tuple[int, int, int, int]:
    """(kind, tag, meta_len, data_len) of a header, or ProtocolError."""
    if len(raw) != HEADER.size:
        raise ProtocolError(f"truncated header: {len(raw)} of {HEADER.size} bytes")
    magic, version, kind, tag, meta_len, data_len = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}")
    if kind not in KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if meta_len > MAX_META:
        raise ProtocolError(f"meta of {meta_len} bytes exceeds {MAX_META}")
    if data_len > MAX_DATA:
        raise ProtocolError(f"data of {data_len} bytes exceeds {MAX_DATA}")
    return kind, tag, meta_len, data_len


def encode_meta(meta: dict) -> bytes:
    return json.dumps(meta, separators=(",", ":")).encode()


def decode_meta(raw: bytes) -> dict:
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # "[[[[..." nests past the parser's limit
        raise ProtocolError(f"meta is not UTF-8 JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"meta is a {type(meta).__name__}, not an object")
    return meta


# ------------------------------------------------------------- tensors
def tensor_meta(tensor: torch.Tensor) -> dict:
    return {"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape)}


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's elements as bytes, without a copy when it is already contiguous."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    if flat.stride(0) != 1:
        # torch calls a view with one element (or size-1 dims) contiguous whatever its
        # strides, and reshape keeps such a stride: copy to get unit stride
        flat = flat.clone(memory_format=torch.contiguous_format)
    return memoryview(flat.view(torch.uint8).numpy())


def tensor_from(meta: dict, data: bytearray) -> torch.Tensor:
    """Rebuild a tensor from its meta and bytes, checking that they agree."""
    name = meta.get("dtype")
    shape = meta.get("shape")
    if not isinstance(name, str) or name not in DTYPES:  # a list or dict is not even hashable
        raise ProtocolError(f"unknown dtype {name!r}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or \
            not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape):
        raise ProtocolError(f"bad shape {shape!r}")
    dtype = DTYPES[name]
    numel = 1
    for dim in shape:
        numel *= dim
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel * itemsize != len(data):
        raise ProtocolError(f"{len(data)} data bytes for a {name} tensor of shape {shape}")
    if numel == 0:
        try:
            return torch.empty(shape, dtype=dtype)
        except RuntimeError as exc:  # no elements, but dimensions whose strides overflow int64
            raise ProtocolError(f"bad shape {shape!r}: {exc}") from None
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)
