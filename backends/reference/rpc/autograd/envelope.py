"""Distributed autograd as an envelope layer of the reference agent (envelope.py): service.py's five seams.

A request sent inside a context is framed as FORWARD_AUTOGRAD_REQ (with a
send function when it carries grad); its callee unwraps it in delivery
order, handles it in the context and frames a response carrying grad as
FORWARD_AUTOGRAD_RESP. The layer also serves autograd's own requests
(propagate gradients, clean-up, RRef backward).
"""

from __future__ import annotations

import torch

from ..envelope import Envelope, OutgoingRequest
from ..transport import Frame
from . import service
from .requests import K_FORWARD_REQ, K_FORWARD_RESP, outcome_text


class AutogradEnvelope(Envelope):
    name = "autograd"
    request_kinds = frozenset((K_FORWARD_REQ,))
    response_kinds = frozenset((K_FORWARD_RESP,))
    served_kinds = service.SERVED

    # ------------------------------------------------------------ caller
    def wrap_request(self, agent, request: OutgoingRequest) -> None:
        if service.current_context_id() == -1:
            return
        # inside a context: maybe FORWARD_AUTOGRAD_REQ with a send function (a fetch always: forceGradRecording)
        request.frame(*service.wrap_request(agent, request.dst, request.kind, request.key, request.payload()))

    def unframe_response(self, agent, src: int, frame: Frame) -> Frame:
        return service.unwrap_response(agent, src, frame)

    # ------------------------------------------------------------ callee
    def unwrap_request(self, agent, src: int, frame: Frame) -> tuple[Frame, int]:
        return service.unwrap_request(agent, src, frame)  # the state: the request's context id

    def scope(self, context_id: int):
        return service.forced_context(context_id)

    def wrap_response(self, agent, dst: int, context_id: int, kind: int, payload: tuple) -> tuple:
        return service.wrap_response(agent, dst, context_id, kind, payload)

    def serve(self, agent, src: int, frame: Frame) -> torch.futures.Future:
        """The request's answer: None, or the error text (torch's autograd requests answer so)."""
        done = service.serve(agent, src, frame)
        answer = torch.futures.Future()
        done.add_done_callback(lambda fut: answer.set_result(outcome_text(fut)))
        return answer
