"""The autograd requests one worker sends another, and what their answers mean.

Below both engine.py (which sends propagate-gradients requests during a
backward pass) and service.py (which serves them, and sends clean-up and
RRef-backward requests): neither imports the other to reach these.
"""

from __future__ import annotations

from ..transport import Kind
from . import messages

K_FORWARD_REQ, K_FORWARD_RESP = int(Kind.FORWARD_AUTOGRAD_REQ), int(Kind.FORWARD_AUTOGRAD_RESP)
K_PROPAGATE, K_CLEANUP = int(Kind.BACKWARD_AUTOGRAD_REQ), int(Kind.CLEANUP_AUTOGRAD_CONTEXT_REQ)
K_RREF_BACKWARD = int(Kind.RREF_BACKWARD_REQ)


def send_propagate(agent, dst: int, context_id: int, msg_id: int, retain_graph: bool, grads: list):
    """Gradients for send function ``msg_id`` of ``dst``: a Future of the answer (see ``outcome_text``)."""
    header = messages.encode_propagate(context_id, msg_id, retain_graph, len(grads))
    return agent.request(dst, K_PROPAGATE, header, [g.detach() for g in grads])


def outcome_text(done) -> str | None:
    """None if the request succeeded, else the error text (an answered error text or the agent's failure)."""
    try:
        value = done.value()
    except Exception as exc:
        return str(exc)
    return value if isinstance(value, str) else None
