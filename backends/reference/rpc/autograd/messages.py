"""Wire codecs of the distributed autograd messages (torch's names: rpc/message.h, autograd/rpc_messages/).

Every header here is a fixed struct, never a pickle, and every decoder checks
every field against the frame it came in (its sender, its tensor count), so
a garbled frame is a ProtocolError naming what is wrong, never a crash:

* FORWARD_AUTOGRAD_REQ / _RESP: an RPC request or response sent inside a
  context. ``FORWARD`` (wrapped kind, context id, autograd message id, sender
  worker id, count of tensors requiring grad), then those tensors' indices
  (u32 each, ascending), then the wrapped message's own header; the tensors
  are the wrapped message's. The receiver makes those tensors the outputs of
  one recv function keyed by the message id (torch's RpcWithAutograd).
* BACKWARD_AUTOGRAD_REQ: ``PROPAGATE`` (context id, message id of the
  forward message whose recv function sends, retain_graph, gradient count);
  the gradients are the frame's tensors (torch's PropagateGradientsReq).
* CLEANUP_AUTOGRAD_CONTEXT_REQ: ``CLEANUP`` (context id).
* RREF_BACKWARD_REQ: ``RREF_BACKWARD`` (RRef id: creator, local id; context id;
  retain_graph) (torch's RRefBackwardReq).

Their responses are ordinary PYTHON_RET frames (value None, or an autograd
error text that the requester prefixes) or EXCEPTION frames.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from backends.reference.codec import ProtocolError

FORWARD = struct.Struct("!BxxxQQiI")
PROPAGATE = struct.Struct("!QQBxxxI")
CLEANUP = struct.Struct("!Q")
RREF_BACKWARD = struct.Struct("!iqQB")
INDEX = struct.Struct("!I")
MAX_GRADS = 1 << 20


@dataclass
class ForwardMeta:
    wrapped_kind: int
    context_id: int
    msg_id: int
    from_worker: int
    grad_indices: list[int]


def encode_forward(wrapped_kind: int, context_id: int, msg_id: int, from_worker: int, grad_indices: list[int],
                   header: bytes) -> bytes:
    return b"".join([FORWARD.pack(wrapped_kind, context_id, msg_id, from_worker, len(grad_indices)),
                     *(INDEX.pack(i) for i in grad_indices), header])


def decode_forward(header: bytes, n_tensors: int, src: int, allowed_kinds) -> tuple[ForwardMeta, bytes]:
    """(metadata, the wrapped header) of a FORWARD_AUTOGRAD frame from worker ``src``."""
    view = memoryview(header)
    if len(view) < FORWARD.size:
        raise ProtocolError(f"autograd envelope of {len(view)} bytes, shorter than its {FORWARD.size}-byte fields")
    kind, context_id, msg_id, from_worker, count = FORWARD.unpack_from(view)
    if kind not in allowed_kinds:
        raise ProtocolError(f"autograd envelope wraps message kind {kind}, not one of {sorted(allowed_kinds)}")
    if from_worker != src:
        raise ProtocolError(f"autograd envelope claims worker {from_worker}, but worker {src} sent it")
    if count > n_tensors:
        raise ProtocolError(f"{count} tensors requiring grad in a message of {n_tensors} tensors")
    end = FORWARD.size + INDEX.size * count
    if len(view) < end:
        raise ProtocolError(f"autograd envelope truncated: {len(view)} bytes, its {count} indices need {end}")
    indices = [INDEX.unpack_from(view, FORWARD.size + INDEX.size * i)[0] for i in range(count)]
    if any(b <= a for a, b in zip(indices, indices[1:])) or (indices and indices[-1] >= n_tensors):
        raise ProtocolError(f"tensor indices {indices} are not ascending below {n_tensors}")
    return ForwardMeta(kind, context_id, msg_id, from_worker, indices), bytes(view[end:])


def check_grad_tensors(tensors: list, indices: list[int]) -> None:
    for i in indices:
        t = tensors[i]
        if not (t.is_floating_point() or t.is_complex()):
            raise ProtocolError(f"tensor {i} is marked as requiring grad but is {t.dtype}")


def encode_propagate(context_id: int, msg_id: int, retain_graph: bool, n_grads: int) -> bytes:
    return PROPAGATE.pack(context_id, msg_id, int(retain_graph), n_grads)


def decode_propagate(header: bytes, n_tensors: int) -> tuple[int, int, bool]:
    if len(header) != PROPAGATE.size:
        raise ProtocolError(f"propagate-gradients header of {len(header)} bytes, expected {PROPAGATE.size}")
    context_id, msg_id, retain, count = PROPAGATE.unpack(header)
    if retain not in (0, 1):
        raise ProtocolError(f"retain_graph flag {retain} is not 0 or 1")
    if count != n_tensors:
        raise ProtocolError(f"propagate-gradients header announces {count} gradients, the frame has {n_tensors}")
    return context_id, msg_id, bool(retain)


def encode_cleanup(context_id: int) -> bytes:
    return CLEANUP.pack(context_id)


def decode_cleanup(header: bytes, n_tensors: int) -> int:
    if len(header) != CLEANUP.size or n_tensors:
        raise ProtocolError(f"clean-up request of {len(header)} bytes and {n_tensors} tensors, expected "
                            f"{CLEANUP.size} bytes and none")
    return CLEANUP.unpack(header)[0]


def encode_rref_backward(rref_id: tuple, context_id: int, retain_graph: bool) -> bytes:
    return RREF_BACKWARD.pack(rref_id[0], rref_id[1], context_id, int(retain_graph))


def decode_rref_backward(header: bytes, n_tensors: int) -> tuple[tuple, int, bool]:
    if len(header) != RREF_BACKWARD.size or n_tensors:
        raise ProtocolError(f"RRef backward request of {len(header)} bytes and {n_tensors} tensors, expected "
                            f"{RREF_BACKWARD.size} bytes and none")
    creator, local_id, context_id, retain = RREF_BACKWARD.unpack(header)
    if retain not in (0, 1):
        raise ProtocolError(f"retain_graph flag {retain} is not 0 or 1")
    return (creator, local_id), context_id, bool(retain)


def zeros_for(shape, dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)
