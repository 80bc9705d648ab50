"""The envelope layers every reference agent wraps its messages in, in wrapping order.

Profiling first (it adds fields to the payload), distributed autograd last
(it frames the encoded payload, fields included). The agent takes this list
by default (``Agent(..., envelopes=...)`` replaces it).
"""

from __future__ import annotations

from .autograd.envelope import AutogradEnvelope
from .envelope import Envelope
from .profiling_envelope import ProfilingEnvelope


def standard() -> tuple[Envelope, ...]:
    return (ProfilingEnvelope(), AutogradEnvelope())
