"""Seeded bug: backward returns once the caller's own part ran, without waiting for the workers it sent gradients to.

The caller's pass counts its local sources but not its outstanding
propagate-gradients requests: when every gradient the caller needs is back,
backward returns while a callee may still be running a part of the pass that
does not lead back (its own leaves, a call to itself). Caught by the
completion clause: a callee branch with a slow backward must have finished
when backward returns.
"""

from backends.reference.rpc.autograd import engine
from tests.seeded.autograd_base import plant


def _ignore_outstanding(original):
    def maybe_done(self):
        with self.lock:
            if self.finished or any(not s.done for s in self.sources.values()):
                return
            # BUG: self.outstanding (propagate requests still running on peers) is not checked
            self.finished = True
            self._detach()
        self.future.set_result(None)
    return maybe_done


DISTCONFORM_SPEC = plant("autograd_early_return", engine.BackwardPass, "_maybe_done", _ignore_outstanding)
