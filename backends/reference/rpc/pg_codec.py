"""reference-pg's frames: encode, decode and validate (the c10d sends and receives are pg_transport.py's).

One frame is a meta message of ``META_BYTES`` (4 KiB): eight int64 fields
``[MAGIC, kind, msg_id, header_len, n_tensors, desc_len, inline, last]``,
then room for a whole small frame. The inline flag says what follows:

* ``INLINE`` (1): the header, the tensor descriptors (per tensor int64
  ``dtype code, ndim, *shape``, or ``dtype code, ndim | STRIDED, *shape,
  *strides`` for a tensor that is not row-major: it travels as the memory its
  elements span, with its strides, as on TensorPipe) and the tensor bytes
  follow the fields; the
  last field is the count of tensor bytes. The whole frame is this message.
* ``BATCH`` (2): several inline records, each exactly as it would travel
  alone; ``header_len`` is their total length, the last field their count.
* ``SPLIT`` (0): a body message follows (header then descriptors, skipped
  when both are empty), then each non-empty tensor's bytes as a flat uint8
  tensor, so every dtype travels whatever the backend supports natively.

A frame of kind ``STOP_KIND`` is the transport's close handshake, never
delivered. Dtype codes, tensor bytes and the descriptor check are the ones
every reference format shares (backends/reference/codec.py). Every decoder
raises ProtocolError naming the sending rank for anything that is not a
frame; nothing is allocated before its descriptor is believed.
"""

from __future__ import annotations

import struct

import torch

from ..codec import CODE_DTYPES, DTYPE_CODES, ProtocolError, check_descriptor, empty, strided_payload
from .transport import Frame

__all__ = ["ProtocolError", "DTYPE_CODES", "encode", "encode_frame", "batch_meta", "read_frame", "read_frames"]

MAGIC = 0x52504346  # "RPCF": a receiver that reads anything else has lost the stream
# Every frame starts with a meta message of this fixed size (a receive from any source
# must know its size): 8 int64 fields, then room for a whole small frame.
META_BYTES = 4096
_FIELDS = struct.Struct("<8q")
FIELDS_BYTES = _FIELDS.size
INLINE_CAPACITY = META_BYTES - FIELDS_BYTES
SPLIT, INLINE, BATCH = 0, 1, 2  # a meta's inline flag: body messages follow / one frame inline / records
STOP_KIND = -1  # transport control frame: "no more frames from me to you"
MAX_HEADER = 1 << 31
MAX_TENSORS = 1 << 20
MAX_NDIM = 64
STRIDED = 1 << 32  # flag in a descriptor's ndim word: the strides follow the shape


def _row_major(shape, strides) -> bool:
    """``strides`` are exactly those of a new tensor of ``shape`` (what a descriptor without STRIDED means)."""
    step = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if stride != step:
            return False
        step *= max(size, 1)
    return True


# --------------------------------------------------------------- encoding
def _parts(frame: Frame, kind: int) -> tuple[bytes, int, int, list[torch.Tensor]]:
    """(header + descriptors, header length, tensor count, data tensors); raises on anything that cannot travel."""
    header = frame.header
    if not isinstance(header, (bytes, bytearray, memoryview)):
        raise TypeError(f"frame header must be bytes, got {type(header).__name__}")
    header = bytes(header)
    for name, value in (("kind", kind), ("msg_id", frame.msg_id)):
        if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"frame {name} must be an int64, got {value!r}")
    if not frame.tensors:  # the common RPC: a pickle and nothing else
        return header, len(header), 0, []
    desc: list[int] = []
    datas: list[torch.Tensor] = []
    for index, tensor in enumerate(frame.tensors):
        data, strides = strided_payload(tensor, index, "reference-pg")
        shape = tuple(tensor.shape)
        if tensor.numel() == 0 or _row_major(shape, strides):
            desc += [DTYPE_CODES[tensor.dtype], len(shape), *shape]
        else:
            desc += [DTYPE_CODES[tensor.dtype], len(shape) | STRIDED, *shape, *strides]
        if data.numel():
            datas.append(data)
    return header + struct.pack(f"<{len(desc)}q", *desc), len(header), len(frame.tensors), datas


def encode_frame(frame: Frame, kind: int | None = None):
    """``(record, None)`` for a frame that fits ``INLINE_CAPACITY``, else ``(None, (meta, body, datas))``.

    A record is the whole frame as bytes, fields first (``inline = 1``, the last field
    the count of tensor bytes after the header and descriptors): alone in a meta
    message it is one c10d message instead of up to 2 + n_tensors, which is what an
    RPC's latency over a c10d backend is made of; several records also share one
    meta (``batch_meta``).
    """
    kind = frame.kind if kind is None else kind
    payload, header_len, n_tensors, datas = _parts(frame, kind)
    data_len = sum(data.numel() for data in datas)
    desc_len = len(payload) - header_len
    if len(payload) + data_len <= INLINE_CAPACITY:
        fields = _FIELDS.pack(MAGIC, kind, frame.msg_id, header_len, n_tensors, desc_len, INLINE, data_len)
        if not datas:
            return fields + payload, None
        return b"".join([fields, payload, *(bytes(data.numpy()) for data in datas)]), None
    meta = meta_message(_FIELDS.pack(MAGIC, kind, frame.msg_id, header_len, n_tensors, desc_len, SPLIT, 0))
    body = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else None
    return None, (meta, body, datas)


def meta_message(content: bytes) -> torch.Tensor:
    """A meta message holding ``content``; the tail is zeros, never stale process memory."""
    buffer = bytearray(META_BYTES)
    buffer[:len(content)] = content
    return torch.frombuffer(buffer, dtype=torch.uint8)


def batch_meta(records) -> torch.Tensor:
    """One meta message carrying several inline records (``inline = 2``), sent in their order.

    The fields say ``header_len`` = the records' total length and, last, how many
    there are; the records follow, each exactly as it would travel alone.
    """
    body = b"".join(records)
    if len(body) > INLINE_CAPACITY:
        raise ValueError(f"a batch of {len(body)} bytes does not fit the {INLINE_CAPACITY} inline bytes")
    return meta_message(_FIELDS.pack(MAGIC, 0, 0, len(body), 0, 0, BATCH, len(records)) + body)


def encode(frame: Frame, kind: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """(meta, body or None, data tensors) of one frame sent alone; raises on anything that cannot travel."""
    record, split = encode_frame(frame, kind)
    if record is not None:
        return meta_message(record), None, []  # a lone inline frame's meta is its record
    return split


def decode_meta(fields: bytes, src: int) -> tuple[int, int, int, int, int, int, int]:
    """(kind, msg_id, header_len, n_tensors, desc_len, inline flag, last field) from a meta's first
    FIELDS_BYTES (or a batch record's); the last field is an inline record's data length, a batch's
    record count."""
    if len(fields) < FIELDS_BYTES:
        raise ProtocolError(f"frame from rank {src}: {len(fields)} bytes where {FIELDS_BYTES} bytes of fields belong")
    magic, kind, msg_id, header_len, n_tensors, desc_len, inline, last = _FIELDS.unpack_from(fields)
    if magic != MAGIC:
        raise ProtocolError(f"frame from rank {src} starts with {magic:#x}, not the magic {MAGIC:#x}")
    if not (0 <= header_len <= MAX_HEADER and 0 <= n_tensors <= MAX_TENSORS and 0 <= desc_len <= MAX_HEADER
            and inline in (SPLIT, INLINE, BATCH)):
        raise ProtocolError(f"frame from rank {src} has impossible fields: header {header_len} bytes, "
                         f"{n_tensors} tensors, descriptors {desc_len} bytes, inline flag {inline}")
    if inline != SPLIT and (header_len + desc_len > INLINE_CAPACITY or not 0 <= last <= INLINE_CAPACITY):
        raise ProtocolError(f"frame from rank {src}: an inline frame of {header_len + desc_len} bytes "
                         f"(last field {last}) does not fit the {INLINE_CAPACITY} inline bytes")
    return kind, msg_id, header_len, n_tensors, desc_len, inline, last


def _tensor_of(data: torch.Tensor, dtype: torch.dtype, shape, strides) -> torch.Tensor:
    """The tensor a descriptor describes over its received bytes (row-major without strides)."""
    typed = data.view(dtype)
    return typed.reshape(shape) if strides is None else typed.as_strided(shape, strides)


def decode_inline_tensors(raw: bytes, descs, src: int) -> list[torch.Tensor]:
    """The tensors of an inline frame from the bytes after its header and descriptors."""
    tensors, at = [], 0
    for dtype, shape, strides, nbytes in descs:
        if not nbytes:
            tensors.append(empty(shape, dtype, strides))
            continue
        if at + nbytes > len(raw):  # checked before anything is allocated
            raise ProtocolError(f"frame from rank {src}: inline tensor data ends after {len(raw)} bytes")
        data = torch.frombuffer(bytearray(raw[at:at + nbytes]), dtype=torch.uint8)
        tensors.append(_tensor_of(data, dtype, shape, strides))
        at += nbytes
    return tensors


def decode_descriptors(desc: bytes, n_tensors: int, src: int) -> list:
    """(dtype, shape, strides or None, data bytes) per tensor, each checked before anything is allocated."""
    if len(desc) % 8:
        raise ProtocolError(f"frame from rank {src}: descriptors of {len(desc)} bytes are not int64s")
    words = struct.unpack(f"<{len(desc) // 8}q", desc)
    out, at = [], 0
    for index in range(n_tensors):
        if at + 2 > len(words):
            raise ProtocolError(f"frame from rank {src}: descriptor of tensor {index} is missing")
        code, ndim_word = words[at], words[at + 1]
        strided = ndim_word >= 0 and bool(ndim_word & STRIDED)
        ndim = ndim_word & ~STRIDED if strided else ndim_word
        length = 2 + (2 * ndim if strided else ndim) if 0 <= ndim <= MAX_NDIM else 0
        if code not in CODE_DTYPES or not 0 <= ndim <= MAX_NDIM or at + length > len(words):
            raise ProtocolError(f"frame from rank {src}: tensor {index} has dtype code {code}, ndim {ndim_word}")
        shape = tuple(words[at + 2: at + 2 + ndim])
        strides = tuple(words[at + 2 + ndim: at + length]) if strided else None
        try:
            dtype, nbytes = check_descriptor(code, shape, strides=strides, max_dims=MAX_NDIM)
        except ProtocolError as exc:
            raise ProtocolError(f"frame from rank {src}: tensor {index}: {exc}") from None
        out.append((dtype, shape, strides, nbytes))
        at += length
    if at != len(words):
        raise ProtocolError(f"frame from rank {src}: {len(words) - at} stray descriptor words")
    return out


def read_frame(raw: bytes, src: int, receive) -> Frame | None:
    """The frame whose meta message is ``raw`` (one frame, not a batch); ``receive(nbytes)``
    returns the next BODY_TAG message from ``src`` as a uint8 tensor. None for a STOP frame."""
    frames = read_frames(raw, src, receive)
    if len(frames) != 1:
        raise ProtocolError(f"frame from rank {src}: a batch of {len(frames)} frames where one was expected")
    return frames[0]


def read_frames(raw: bytes, src: int, receive) -> list:
    """Every frame a meta message ``raw`` starts: one (None for a STOP), or a batch's, in order."""
    kind, msg_id, header_len, n_tensors, desc_len, inline, last = decode_meta(raw, src)
    if inline == BATCH:
        return _read_batch(raw[FIELDS_BYTES:FIELDS_BYTES + header_len], last, src)
    if inline == INLINE:
        return [_inline_frame(raw, src, (kind, msg_id, header_len, n_tensors, desc_len, inline, last))]
    if header_len + desc_len:
        payload = receive(header_len + desc_len).numpy().tobytes()
    else:
        payload = b""
    header, desc = payload[:header_len], payload[header_len:]
    tensors = []
    for dtype, shape, strides, nbytes in decode_descriptors(desc, n_tensors, src):
        tensors.append(_tensor_of(receive(nbytes), dtype, shape, strides) if nbytes else empty(shape, dtype, strides))
    if kind == STOP_KIND:
        return [None]
    return [Frame(kind=kind, msg_id=msg_id, header=header, tensors=tensors)]


def _inline_frame(record: bytes, src: int, fields) -> Frame | None:
    """The frame of one inline record (its fields already decoded); None for a STOP."""
    kind, msg_id, header_len, n_tensors, desc_len, _, data_len = fields
    start = FIELDS_BYTES + header_len + desc_len
    header = record[FIELDS_BYTES:FIELDS_BYTES + header_len]
    desc = record[FIELDS_BYTES + header_len:start]
    descs = decode_descriptors(desc, n_tensors, src) if desc or n_tensors else ()
    tensors = decode_inline_tensors(record[start:], descs, src) if descs else []
    got = sum(desc[-1] for desc in descs)  # bytes the descriptors span (an expanded tensor has more elements)
    if got != data_len:
        raise ProtocolError(f"frame from rank {src}: inline tensors of {got} bytes where the fields say {data_len}")
    if kind == STOP_KIND:
        return None
    return Frame(kind=kind, msg_id=msg_id, header=header, tensors=tensors)


def _read_batch(body: bytes, count: int, src: int) -> list[Frame]:
    """The frames of a batch meta's records, each checked as if it had come alone."""
    if count < 1:
        raise ProtocolError(f"frame from rank {src}: a batch of {count} records")
    frames, at = [], 0
    for index in range(count):
        fields = decode_meta(body[at:at + FIELDS_BYTES], src)
        kind, _, header_len, _, desc_len, inline, data_len = fields
        if inline != INLINE or kind == STOP_KIND:
            raise ProtocolError(f"frame from rank {src}: batch record {index} of {count} is not an inline frame "
                             f"(kind {kind}, inline flag {inline})")
        end = at + FIELDS_BYTES + header_len + desc_len + data_len
        if end > len(body):
            raise ProtocolError(f"frame from rank {src}: batch record {index} of {count} ends at byte {end}, "
                             f"after the batch's {len(body)} bytes")
        frame = _inline_frame(body[at:end], src, fields)
        assert frame is not None  # None only for a STOP, refused above
        frames.append(frame)
        at = end
    if at != len(body):
        raise ProtocolError(f"frame from rank {src}: {len(body) - at} stray bytes after a batch of {count} records")
    return frames
