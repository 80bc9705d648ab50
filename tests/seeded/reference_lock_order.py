"""Seeded bug in the reference backend: all_reduce and send take two process-wide locks in opposite orders.

Every group of a process shares two locks. ``allreduce`` takes the queue lock, then the wire lock;
``send`` takes the wire lock, then the queue lock. One thread all_reducing on one group while another
sends on a second group each take their first lock and wait forever for the other's: a lock-order
deadlock between two groups. Caught by suites/soak/test_concurrency.py::
test_all_reduce_and_p2p_on_separate_groups_at_once as a deadline failure (the rank reports both
threads stuck, with their stacks), not as a hang of the run.
"""

import threading
import time

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


_QUEUE_LOCK = threading.Lock()
_WIRE_LOCK = threading.Lock()
_WINDOW_S = 0.05  # time between the two acquisitions: wide enough that the threads always cross


class LockOrder(ReferenceProcessGroup):
    """all_reduce locks queue then wire; send locks wire then queue."""

    def allreduce(self, tensors, opts=None):
        with _QUEUE_LOCK:
            time.sleep(_WINDOW_S)
            with _WIRE_LOCK:  # BUG: the opposite order of send's
                return super().allreduce(tensors, opts)

    def send(self, tensors, dst, tag):
        with _WIRE_LOCK:
            time.sleep(_WINDOW_S)
            with _QUEUE_LOCK:
                return super().send(tensors, dst, tag)


DISTCONFORM_SPEC = register_reference("reference_lock_order", LockOrder)
