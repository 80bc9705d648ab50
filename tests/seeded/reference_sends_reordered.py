"""Seeded bug in the reference backend: two sends to one peer in a row leave in reverse order.

A send buffer that holds a small message back briefly (to pack it with the
next one to the same peer) and then flushes the newest first: a lone message
still arrives (100 ms late), but of two back-to-back messages to one peer the
second is delivered first, so the receiver's first irecv gets the second
message. c10d matches messages between a pair of ranks in the order they
were issued. Caught by suites/p2p/test_batch_mixed.py::test_batch_all_pairs_mixed_order
(several messages per peer in one batch, of different sizes).
"""

import threading

from backends.reference.process_group import ReferenceWork
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference

HOLD_S = 0.1


class SendsReordered(ReferenceProcessGroup):
    """A send is held back HOLD_S seconds; a second send to the same peer meanwhile goes out first."""

    def send(self, tensors, dst, tag):
        if not hasattr(self, "_held"):
            self._held, self._held_lock = {}, threading.Lock()
        tensor = tensors[0].detach().clone()
        with self._held_lock:
            earlier = self._held.pop((dst, tag), None)
            if earlier is None:
                self._held[(dst, tag)] = tensor
                timer = threading.Timer(HOLD_S, self._flush, args=(dst, tag, tensor))
                timer.daemon = True
                timer.start()
        if earlier is not None:
            super().send([tensor], dst, tag)  # BUG: the newer message leaves first
            super().send([earlier], dst, tag)
        work = ReferenceWork(f"send to rank {dst} tag {tag}", self.timeout.total_seconds())
        work.complete(list(tensors))  # buffered: complete for the caller
        return work

    def _flush(self, dst, tag, tensor) -> None:
        with self._held_lock:
            if self._held.get((dst, tag)) is not tensor:
                return  # already sent with a later message
            del self._held[(dst, tag)]
        super().send([tensor], dst, tag)


DISTCONFORM_SPEC = register_reference("reference_sends_reordered", SendsReordered)
