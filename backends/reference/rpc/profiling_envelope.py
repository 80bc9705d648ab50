"""Remote profiling as an envelope layer of the reference agent (envelope.py): profiling.py's agent seams.

A call the caller's profiler records (calls.py hands the agent its
``profiling.Call``) carries the profiler config in its ``profiling`` field;
the callee runs it profiled and answers with its events in the same field;
the caller absorbs them (or nothing, when the call failed).
"""

from __future__ import annotations

import torch

from . import profiling
from .envelope import Envelope, OutgoingRequest


class ProfilingEnvelope(Envelope):
    name = "profiling"

    def wrap_request(self, agent, request: OutgoingRequest) -> None:
        call = request.call
        if call is None or not request.carries_fields:
            return
        request.add_fields(self.name, profiling.request_fields(call))
        request.keep(self.name, call)

    def unwrap_response(self, agent, call, envelope) -> None:
        profiling.absorb_response(call, envelope)

    def detached(self):
        return profiling.unrecorded()

    def run(self, agent, fields, run, reply: dict) -> torch.futures.Future:
        """The request run under the caller's profiler config; its events go into ``reply``."""
        profiled = profiling.run_profiled(fields, run)  # completes with (outcome, envelope)
        outcome = torch.futures.Future()

        def unpack(done):
            try:
                value, envelope = done.value()
            except BaseException as exc:  # noqa: BLE001 - the request failed: no events travel
                outcome.set_exception(exc)
                return
            reply[self.name] = envelope
            outcome.set_result(value)

        profiled.add_done_callback(unpack)
        return outcome
