"""The reference backend's wire format: one frame per message, checked field by field.

    header   magic "DCRF" | version u8 | kind u8 | 2 pad bytes | tag i64 | meta_len u32 | data_len u64
    meta     meta_len bytes of UTF-8 JSON (an object): small, self-describing fields
    data     data_len raw bytes: a tensor's storage, never pickled

Nothing read from a socket is ever unpickled or trusted: every field is
validated and any violation raises ProtocolError, which the transport turns
into a refused connection with an error, never a crash or a hang. The dtype
table, the tensor bytes and the descriptor check are the ones every reference
wire format shares (codec.py); a dtype travels here by its name.
"""

from __future__ import annotations

import json
import struct

import torch

from .codec import (DTYPE_CODES, DTYPE_NAMES, DTYPES, ProtocolError, check_descriptor, check_frame_header, check_length,
                    empty, tensor_bytes)

__all__ = ["ProtocolError", "DTYPES", "DTYPE_NAMES", "tensor_bytes", "tensor_meta", "tensor_from"]

MAGIC = b"DCRF"
VERSION = 1
HEADER = struct.Struct("!4sBBxxqIQ")
MAX_META = 1 << 16
MAX_DATA = 1 << 36  # 64 GiB: anything larger is a garbled length, not a tensor

HELLO, P2P, COLL = 1, 2, 3
KINDS = {HELLO: "hello", P2P: "p2p", COLL: "collective"}

MAX_DIMS = 16


def encode_header(kind: int, tag: int, meta: bytes, data_len: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, tag, len(meta), data_len)


def decode_header(raw: bytes | bytearray) -> tuple[int, int, int, int]:
    """(kind, tag, meta_len, data_len) of a header, or ProtocolError."""
    if len(raw) != HEADER.size:
        raise ProtocolError(f"truncated header: {len(raw)} of {HEADER.size} bytes")
    magic, version, kind, tag, meta_len, data_len = HEADER.unpack(raw)
    check_frame_header(magic, version, kind, expected_magic=MAGIC, expected_version=VERSION, kinds=KINDS)
    check_length("meta", meta_len, MAX_META)
    check_length("data", data_len, MAX_DATA)
    return kind, tag, meta_len, data_len


def encode_meta(meta: dict) -> bytes:
    return json.dumps(meta, separators=(",", ":")).encode()


def decode_meta(raw: bytes | bytearray) -> dict:
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


def tensor_from(meta: dict, data: bytearray) -> torch.Tensor:
    """Rebuild a tensor from its meta and bytes, checking that they agree."""
    name = meta.get("dtype")
    shape = meta.get("shape")
    if not isinstance(name, str) or name not in DTYPES:  # a list or dict is not even hashable
        raise ProtocolError(f"unknown dtype {name!r}")
    if not isinstance(shape, list):
        raise ProtocolError(f"bad shape {shape!r}")
    try:
        dtype, _ = check_descriptor(DTYPE_CODES[DTYPES[name]], shape, nbytes=len(data), max_dims=MAX_DIMS)
    except ProtocolError as exc:
        raise ProtocolError(f"{name} tensor: {exc}") from None
    if not data:
        return empty(shape, dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)
