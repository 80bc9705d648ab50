"""Send and recv functions: where a distributed autograd graph crosses an RPC.

torch records a ``SendRpcBackward`` node on the sender of every message of a
context that carries tensors requiring grad (its next functions are those
tensors' grad functions) and a ``RecvRpcBackward`` node on the receiver (the
grad function of every such tensor that arrived). Here both are
torch.autograd.Function nodes, so the graph stays torch's own:

* ``SendRpc.apply(*sent)`` gives a 0-element tensor whose ``grad_fn`` is the
  send node (``.name()`` "SendRpcBackward", next functions the sent tensors'
  grad functions, in order). A backward pass hands the gradients a peer
  propagated to it (``node.grads``) and runs the local engine from it.
* ``RecvRpc.apply(anchor, received)`` makes the received tensors (the same
  objects) outputs of one recv node (``.name()`` "RecvRpcBackward"). Its
  backward gives nothing: the backward pass takes the gradients flowing
  *into* it (a pre hook, engine.py) and sends them to the worker that sent the
  message. Its only next function is a shared 0-element anchor leaf (an
  autograd Function needs an input requiring grad to record anything).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.graph import GradientEdge


class SendRpc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *tensors):
        return torch.empty(0)

    @staticmethod
    def backward(ctx, _unused):
        grads = ctx.grads  # set by the engine from a propagate-gradients request
        ctx.grads = None
        return tuple(grads)


class RecvRpc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, received):
        return tuple(received)

    @staticmethod
    def backward(ctx, *grads):  # the pass took the gradients in a pre hook of this node (engine.py)
        return None, None


_ANCHOR = torch.empty(0, requires_grad=True)


@dataclass
class SendRecord:
    """A send function: the message it recorded went to ``dst``; ``output`` owns ``node`` (keeps the graph)."""

    msg_id: int
    dst: int
    output: torch.Tensor  # SendRpc's 0-element output: its grad_fn is the send node
    shapes: tuple  # (shape, dtype) per sent tensor: a propagated gradient must match

    @property
    def node(self):
        return self.output.grad_fn


@dataclass
class RecvRecord:
    """A recv function: the message came from ``src``; gradients of its outputs go back there."""

    msg_id: int
    src: int
    node: object  # RecvRpcBackward
    shapes: tuple

    def edges(self) -> list:
        return [GradientEdge(self.node, i) for i in range(len(self.shapes))]


def record_send(msg_id: int, dst: int, sent: list[torch.Tensor]) -> SendRecord:
    with torch.enable_grad():
        output = SendRpc.apply(*sent)
    return SendRecord(msg_id, dst, output, tuple((tuple(t.shape), t.dtype) for t in sent))


def record_recv(msg_id: int, src: int, received: list[torch.Tensor]) -> RecvRecord:
    """Make ``received`` (in place: the same tensor objects) outputs of one new recv node."""
    with torch.enable_grad():
        outputs = RecvRpc.apply(_ANCHOR, list(received))
    return RecvRecord(msg_id, src, outputs[0].grad_fn, tuple((tuple(t.shape), t.dtype) for t in received))


def is_recv_node(node) -> bool:
    return type(node) is RecvRpc._backward_cls


def is_send_node(node) -> bool:
    return type(node) is SendRpc._backward_cls
