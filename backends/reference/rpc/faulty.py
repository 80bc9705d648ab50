"""Fault injection for any reference transport: fail or delay chosen message kinds.

Modelled on torch's faulty agent (torch/csrc/distributed/rpc/testing/
faulty_tensorpipe_agent.cpp), so one test means the same on ``tensorpipe``
(FaultyTensorPipeRpcBackendOptions) and on the reference agents:

* ``faults.fail``: message kinds (torch's names, ``backends.rpc_agents.
  FAULTABLE_KINDS``) whose sends fail. Torch does not drop such a message
  silently: ``FaultyTensorPipeAgent::send`` returns a future already failed
  with "Send attempt failed intentionally for <payload>" and never sends
  anything. Here ``send()`` raises ``IntentionalFailure`` (a TransportError)
  with that text before anything reaches the wire; the agent fails the
  caller's future with it, as for any send error. Torch counts attempts per
  message *payload* (its key is the payload bytes), not per kind: each
  distinct message fails its first ``num_fail_sends`` sends, and a retry of
  the same message (torch's RRef control messages are retried) succeeds
  after that. The key here is (kind, header): the header is the agent's
  payload, msg_id travels beside it, so the agent must keep per-send ids out
  of the header for retries to count as the same message.
* ``faults.delay``: kind -> seconds. Every send of such a kind is held back
  that long. Torch sleeps in the sending thread; here the frame waits in a
  per-kind queue served by its own thread, so neither the caller nor frames
  of other kinds wait (frames of one kind keep their order). A delayed frame
  whose real send fails later reports through ``on_peer_lost``, since no
  caller is left to raise to. Frames still held back at shutdown are dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from backends.rpc_agents import FAULTABLE_KINDS, Faults

from .transport import Frame, Kind, PeerLost, Transport, TransportError

log = logging.getLogger(__name__)

DELAY_JOIN_S = 5.0


class IntentionalFailure(TransportError):
    """A send failed on purpose (fault injection), like torch's INTENTIONAL_FAILURE."""


def _kind_codes(names, what: str) -> list[int]:
    names = [names] if isinstance(names, str) else list(names)
    unknown = [name for name in names if name not in FAULTABLE_KINDS]
    if unknown:
        raise ValueError(f"unknown message kind(s) {unknown} in {what}; valid kinds: {', '.join(FAULTABLE_KINDS)}")
    return [int(Kind[name]) for name in names]


class FaultyTransport(Transport):
    def __init__(self, inner: Transport, faults: Faults):
        self.inner = inner
        self.name = f"faulty-{inner.name}"
        # the agent may run requests on the inner transport's reader threads; faults change nothing there
        self.runs_inline = bool(getattr(inner, "runs_inline", False))
        if not isinstance(faults.num_fail_sends, int) or faults.num_fail_sends < 0:
            raise ValueError(f"num_fail_sends must be a non-negative int, got {faults.num_fail_sends!r}")
        self.num_fail_sends = faults.num_fail_sends
        self.fail_kinds = frozenset(_kind_codes(faults.fail, "faults.fail"))
        delays = dict(faults.delay or {})
        codes = _kind_codes(list(delays), "faults.delay")
        self.delays: dict[int, float] = {}
        for code, (name, seconds) in zip(codes, delays.items()):
            if not isinstance(seconds, (int, float)) or seconds < 0:
                raise ValueError(f"delay for {name} must be a non-negative number of seconds, got {seconds!r}")
            self.delays[code] = float(seconds)
        self._attempts: dict[tuple[int, bytes], int] = {}
        self._lock = threading.Lock()
        self._queues: dict[int, queue.SimpleQueue] = {}
        self._workers: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._on_peer_lost: PeerLost | None = None  # set by start()
        # observable counts, for tests and reports
        self.failed_sends = 0
        self.delayed_sends = 0
        self.dropped_at_shutdown = 0

    def start(self, rank, world_size, store, deliver, on_peer_lost) -> None:
        self._on_peer_lost = on_peer_lost
        self.inner.start(rank, world_size, store, deliver, on_peer_lost)

    def send(self, dst: int, frame: Frame) -> None:
        if frame.kind in self.fail_kinds:
            key = (frame.kind, bytes(frame.header))
            with self._lock:
                attempts = self._attempts.get(key, 0)
                fail = attempts < self.num_fail_sends
                if fail:
                    self._attempts[key] = attempts + 1
                    self.failed_sends += 1
            if fail:
                raise IntentionalFailure(
                    f"Send attempt failed intentionally for {Kind(frame.kind).name} message {frame.msg_id} "
                    f"to rank {dst} (attempt {attempts + 1} of {self.num_fail_sends} that fault injection fails)")
        delay = self.delays.get(frame.kind)
        if delay:  # a zero delay is no delay, as in torch
            if self._stopping.is_set():
                raise TransportError(f"cannot send to rank {dst}: the transport is shut down")
            with self._lock:
                self.delayed_sends += 1
            self._queue_for(frame.kind).put((time.monotonic() + delay, dst, frame))
            return
        self.inner.send(dst, frame)

    def _queue_for(self, kind: int) -> queue.SimpleQueue:
        with self._lock:
            q = self._queues.get(kind)
            if q is None:
                q = self._queues[kind] = queue.SimpleQueue()
                worker = threading.Thread(target=self._serve_delayed, args=(q,), daemon=True,
                                          name=f"faulty-delay-{Kind(kind).name}")
                self._workers.append(worker)
                worker.start()
            return q

    def _serve_delayed(self, q: queue.SimpleQueue) -> None:
        # One kind has one delay, so arrival order is due order: FIFO is enough.
        while True:
            item = q.get()
            if item is None:
                return
            due, dst, frame = item
            if self._stopping.wait(max(0.0, due - time.monotonic())):
                with self._lock:
                    self.dropped_at_shutdown += 1
                continue
            try:
                self.inner.send(dst, frame)
            except TransportError as exc:
                assert self._on_peer_lost is not None  # frames are delayed by send(), which runs after start()
                self._on_peer_lost(dst, f"a delayed {Kind(frame.kind).name} frame to rank {dst} failed: {exc}")
            except Exception:
                log.exception("faulty transport: delayed send to rank %d raised", dst)

    def shutdown(self, within_s: float | None = None) -> None:
        self._stopping.set()
        with self._lock:
            queues, workers = list(self._queues.values()), list(self._workers)
        for q in queues:
            q.put(None)
        deadline = time.monotonic() + DELAY_JOIN_S
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        self.inner.shutdown(within_s)
