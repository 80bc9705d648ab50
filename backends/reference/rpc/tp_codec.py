"""reference-tp's frames: encode, read and validate (the connections are tp_transport.py's).

A frame on the wire (little endian)::

    prefix   magic "DCRP" | version u8 | kind u8 | n_tensors u16 | msg_id u64 | header_len u32
    tensors  n_tensors x (dtype u8 | ndim u8 | 2 pad | nbytes u64 | ndim x size i64 | ndim x stride i64)
    header   header_len bytes: the agent's pickle, never looked into here
    data     each tensor's nbytes, raw, in order

Control frames (HELLO, REFUSED) have the same prefix, no tensors and a small
JSON object as header; they are only read during the handshake, straight from
the socket. Dtype codes, tensor bytes and the descriptor check are the ones
every reference format shares (backends/reference/codec.py).

Every field is validated before anything is allocated: a ProtocolError names
what is wrong (the transport adds the peer and drops its connection). Tensor
bytes land in a ``torch.empty`` buffer and become the tensor by
``as_strided`` with the validated sizes and strides: no copy, no pickle.
A tensor travels with its own strides over the memory its elements span
(codec.strided_payload: a transpose arrives transposed, as on TensorPipe).
"""

from __future__ import annotations

import json
import socket
import struct

import torch

from ..codec import (CODE_DTYPES, DTYPE_CODES, MAX_TENSOR_BYTES, ProtocolError, check_descriptor, check_frame_header,
                     check_length, empty, strided_payload)
from .transport import Frame, Kind

__all__ = ["ProtocolError", "encode", "read_frame", "hello_bytes", "read_control", "DTYPES"]

MAGIC = b"DCRP"
VERSION = 1
PREFIX = struct.Struct("<4sBBHQI")
TENSOR = struct.Struct("<BBxxQ")
HELLO, REFUSED = 0, 255  # transport-private kinds: never delivered to the agent
KINDS = frozenset(int(k) for k in Kind)

MAX_TENSORS = 1 << 12
MAX_DIMS = 16
MAX_HEADER = 1 << 28  # 256 MiB of pickle: anything larger is a garbled length
MAX_HELLO = 4096
READ_CHUNK = 1 << 20  # a large claimed length is read in chunks: no allocation before bytes arrive

DTYPES = tuple(CODE_DTYPES.values())  # every dtype reference-tp carries (the shared table)


class UnsendableTensor(ValueError):
    """A frame's tensor has no place on this wire (dtype, device, layout, dims)."""


# --------------------------------------------------------------- encoding
def encode(frame: Frame) -> list:
    """The frame as a list of buffers: small ones first, tensor data last.

    Raises UnsendableTensor (a ValueError) or TypeError naming a tensor that cannot travel.
    """
    tensors = frame.tensors
    header = frame.header
    parts: list[bytes | memoryview] = [PREFIX.pack(MAGIC, VERSION, frame.kind, len(tensors), frame.msg_id, len(header))]
    if not tensors:
        parts.append(header)
        return parts
    datas = []
    for index, tensor in enumerate(tensors):
        if isinstance(tensor, torch.Tensor) and tensor.dim() > MAX_DIMS:
            raise UnsendableTensor(f"reference-tp sends tensors of at most {MAX_DIMS} dims, not {tensor.dim()}")
        try:
            payload, strides = strided_payload(tensor, index, "reference-tp")  # torch's strides, not row-major
        except ValueError as exc:
            raise UnsendableTensor(str(exc)) from None
        shape = tuple(tensor.shape)
        nbytes = payload.numel()
        parts.append(TENSOR.pack(DTYPE_CODES[tensor.dtype], len(shape), nbytes))
        if shape:
            parts.append(struct.pack(f"<{2 * len(shape)}q", *shape, *strides))
        if nbytes:
            datas.append(memoryview(payload.numpy()))
    parts.append(header)
    parts.extend(datas)
    return parts


def hello_bytes(kind: int, payload: dict) -> bytes:
    """A HELLO or REFUSED control frame: a small JSON object as header."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, VERSION, kind, 0, 0, len(body)) + body


# --------------------------------------------------------------- reading
def _read(stream, n: int) -> bytes:
    """Exactly n bytes; EOFError at a clean end before any, ProtocolError when cut short."""
    if n <= READ_CHUNK:
        data = stream.read(n)
        if len(data) == n:
            return data
        if not data:
            raise EOFError
        raise ProtocolError(f"truncated frame: {len(data)} of {n} bytes before the connection closed")
    chunks, got = [], 0
    while got < n:  # a claimed length is only believed as far as bytes arrive
        chunk = stream.read(min(READ_CHUNK, n - got))
        if not chunk:
            raise ProtocolError(f"truncated frame: {got} of {n} bytes before the connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_into(stream, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        chunk = stream.readinto(view[got:got + READ_CHUNK * 64])
        if not chunk:
            raise ProtocolError(f"truncated tensor data: {got} of {n} bytes before the connection closed")
        got += chunk


def read_frame(stream) -> Frame:
    """One frame from a buffered stream, every field checked; EOFError at a clean end."""
    prefix = stream.read(PREFIX.size)
    if len(prefix) != PREFIX.size:
        if not prefix:
            raise EOFError
        raise ProtocolError(f"truncated frame prefix: {len(prefix)} of {PREFIX.size} bytes")
    magic, version, kind, n_tensors, msg_id, header_len = PREFIX.unpack(prefix)
    if kind == REFUSED and not n_tensors and header_len <= MAX_HELLO:  # our hello was refused: say why
        check_frame_header(magic, version, kind, expected_magic=MAGIC, expected_version=VERSION, kinds=(REFUSED,))
        raise ProtocolError(f"refused our connection: {_read(stream, header_len).decode(errors='replace')}")
    check_frame_header(magic, version, kind, expected_magic=MAGIC, expected_version=VERSION, kinds=KINDS)
    if n_tensors > MAX_TENSORS:
        raise ProtocolError(f"{n_tensors} tensors in one frame (at most {MAX_TENSORS})")
    check_length("header", header_len, MAX_HEADER)
    specs = []
    for _ in range(n_tensors):
        code, ndim, nbytes = TENSOR.unpack(_read(stream, TENSOR.size))
        if ndim > MAX_DIMS:
            raise ProtocolError(f"tensor of {ndim} dims (at most {MAX_DIMS})")
        dims = struct.unpack(f"<{2 * ndim}q", _read(stream, 16 * ndim)) if ndim else ()
        sizes, strides = dims[:ndim], dims[ndim:]
        dtype, _ = check_descriptor(code, sizes, strides=strides, nbytes=nbytes, max_dims=MAX_DIMS,
                                    max_bytes=MAX_TENSOR_BYTES)
        specs.append((dtype, nbytes, sizes, strides))
    header = _read(stream, header_len)
    tensors = []
    for dtype, nbytes, sizes, strides in specs:
        if nbytes == 0:
            tensors.append(empty(sizes, dtype, strides))
            continue
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        _read_into(stream, memoryview(buffer.numpy()))
        tensors.append(buffer.view(dtype).as_strided(sizes, strides))
    return Frame(kind, msg_id, header, tensors)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """n bytes straight from the socket: a handshake must not read ahead into the frames after it."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ProtocolError(f"connection closed during the handshake ({len(data)} of {n} bytes)")
        data += chunk
    return bytes(data)


def read_control(sock: socket.socket) -> tuple[int, dict]:
    """A HELLO or REFUSED frame: JSON, small, nothing else accepted (the magic is checked first)."""
    magic = _recv_exactly(sock, len(MAGIC))
    if magic != MAGIC:
        raise ProtocolError(f"not a reference-tp peer (magic {magic!r})")
    _, version, kind, n_tensors, _, length = PREFIX.unpack(magic + _recv_exactly(sock, PREFIX.size - len(MAGIC)))
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}")
    if kind not in (HELLO, REFUSED) or n_tensors or length > MAX_HELLO:
        raise ProtocolError(f"expected a hello, got kind {kind} with {n_tensors} tensors and {length} header bytes")
    try:
        body = json.loads(_recv_exactly(sock, length).decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"hello is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("hello is not a JSON object")
    return kind, body


def read_hello(sock: socket.socket) -> dict:
    """The JSON object of a HELLO (a REFUSED or anything else where a hello belongs is refused)."""
    kind, body = read_control(sock)
    if kind != HELLO:
        raise ProtocolError("first frame is not a hello")
    return body
