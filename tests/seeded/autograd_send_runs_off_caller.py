"""Seeded bug: the caller's send functions run on the agent thread that delivered their gradients.

That thread is outside the caller's thread-local state, so a profiler on
the caller never sees the send functions run (the reference engine before it
handed that work to the caller's waiting thread, as torch's graph task runs
under the caller's ThreadLocalState). Caught by the profiled-backward clause.
"""

from backends.reference.rpc.autograd import engine
from tests.seeded.autograd_base import plant


def _run_where_delivered(original):
    def deliver(self, msg_id, grads):
        with self.lock:
            source = self.sources.get(("send", msg_id))
            if source is None or source.ready:
                raise RuntimeError(f"send function {msg_id} is not waiting for gradients in this backward pass")
            source.seed = grads
            source.ready = True
        self.run_ready()  # BUG: on the delivering agent thread, not the caller's
    return deliver


DISTCONFORM_SPEC = plant("autograd_send_runs_off_caller", engine.BackwardPass, "deliver", _run_where_delivered)
