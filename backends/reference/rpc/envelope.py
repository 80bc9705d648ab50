"""The one interface between the reference agent and what travels around its calls.

torch layers distributed autograd and profiling around an RPC by wrapping
the message (RpcCommandBase, FORWARD_AUTOGRAD_REQ, RUN_WITH_PROFILING_REQ).
The agent (agent.py) does the same through ``Envelope`` layers and names
none of them: it asks each layer, in order, to

* ``wrap_request``: add its fields to an outgoing request (they travel in
  the request's payload under the layer's name) and keep caller-side state,
  or frame the whole request in a message kind of its own (``frame``);
* ``unwrap_request``: take an incoming frame of one of its ``request_kinds``
  apart, in delivery order, into the inner request and the state the layer
  keeps for that request (``scope`` then covers the request's handling and
  ``wrap_response`` its response);
* ``run``: run a request whose payload carries the layer's fields (its reply
  fields go back in the response's payload);
* ``wrap_response``: frame a response to a request it unwrapped;
* ``unframe_response`` / ``unwrap_response``: the caller's side of the two:
  an incoming frame of one of its ``response_kinds``, then the layer's reply
  fields (None when none came, or when the call failed without an answer).

A layer may also answer requests of its own (``served_kinds``: autograd's
propagate-gradients, clean-up, RRef-backward) with ``serve``.

At most one layer frames a given message: layers that only add fields never
frame, so the agent never has to nest frames. Every method's default lets
the message pass unchanged, so a layer implements only what it uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .transport import Frame

_NOTHING = contextlib.nullcontext()


class OutgoingRequest:
    """A request on the caller's side, before it is encoded.

    ``body`` is the request's payload without the layers' fields; ``call``
    is what the caller's API handed the agent about this call (calls.py:
    profiling's record of it, or None). A request with ``carries_fields``
    False (an RRef fetch) travels as its body alone: layers may frame it
    but add no fields.
    """

    __slots__ = ("dst", "kind", "key", "body", "call", "carries_fields", "fields", "state", "framed")

    def __init__(self, dst: int, kind: int, key, body, call=None, *, carries_fields: bool = True):
        self.dst, self.kind, self.key, self.body, self.call = dst, kind, key, body, call
        self.carries_fields = carries_fields
        self.fields: dict | None = None  # layer name -> what that layer's callee side reads
        self.state: dict | None = None  # layer name -> what that layer needs when the call ends
        self.framed: tuple | None = None  # (kind, header, tensors) once a layer framed the request

    def add_fields(self, layer: str, value) -> None:
        if not self.carries_fields:
            raise RuntimeError(f"a {self.kind} request carries no envelope fields (layer {layer})")
        if self.fields is None:
            self.fields = {}
        self.fields[layer] = value

    def keep(self, layer: str, value) -> None:
        """Caller-side state of ``layer`` for this call, handed back to its ``unwrap_response``."""
        if self.state is None:
            self.state = {}
        self.state[layer] = value

    def payload(self):
        """What travels: the body, with the layers' fields (None when no layer added any) as its last item."""
        if not self.carries_fields:
            return self.body
        return (*self.body, self.fields)

    def frame(self, kind: int, header: bytes, tensors: list) -> None:
        if self.framed is not None:
            raise RuntimeError("two envelope layers framed the same request")
        self.framed = (kind, header, tensors)


class Envelope:
    """One layer around the agent's messages (see the module docstring); defaults pass everything through."""

    name: str = ""
    request_kinds: frozenset = frozenset()  # frames this layer wraps requests in
    response_kinds: frozenset = frozenset()  # frames this layer wraps responses in
    served_kinds: frozenset = frozenset()  # requests of the layer's own, answered by ``serve``

    # ------------------------------------------------------------ caller
    def wrap_request(self, agent, request: OutgoingRequest) -> None:
        """Add fields or state to ``request``, or frame it."""

    def unframe_response(self, agent, src: int, frame: Frame) -> Frame:
        """The response inside a frame of one of ``response_kinds`` (raise: the call fails with it)."""
        return frame

    def unwrap_response(self, agent, state, fields) -> None:
        """The call ended: ``state`` from ``wrap_request``, ``fields`` this layer's reply fields (or None)."""

    def detached(self):
        """A scope for the agent's work on behalf of an earlier call, done later from a callback."""
        return _NOTHING

    # ------------------------------------------------------------ callee
    def unwrap_request(self, agent, src: int, frame: Frame) -> tuple[Frame, Any]:
        """(the inner request, this layer's state for it) of a frame of one of ``request_kinds``.

        Raise for a malformed frame: the agent refuses it, naming the sender.
        """
        return frame, None

    def scope(self, state):
        """The context the request unwrapped with ``state`` is handled in (nested calls included)."""
        return _NOTHING

    def run(self, agent, fields, run: Callable[[], torch.futures.Future], reply: dict) -> torch.futures.Future:
        """Run a request whose payload carries this layer's ``fields``; put reply fields in ``reply[name]``.

        ``run()`` returns a Future of the request's outcome; so does this.
        """
        return run()

    def wrap_response(self, agent, dst: int, state, kind: int, payload: tuple) -> tuple | None:
        """(kind, header, tensors) framing the response to a request this layer unwrapped, or None."""
        return None

    def serve(self, agent, src: int, frame: Frame) -> torch.futures.Future:
        """Answer a request of one of ``served_kinds``: a Future of the response value."""
        raise NotImplementedError(f"{type(self).__name__} serves no requests")
