"""The distributed autograd context whose gradients the hooks running on this thread belong to.

torch's DistAccumulateGradCaptureHook (dist_engine.cpp) sets the thread's
``ThreadLocalDistAutogradContext`` to the context of the backward pass while a
leaf's AccumulateGrad pre and post hooks run, and DDP's reducer reads it there
(reducer.cpp ``runGradCallbackForVariable``): inside a context the reducer
reads a parameter's gradient from the context and writes the averaged one back
into it, never into ``.grad``. This module is that thread-local, between the
reference's distributed autograd engine (which sets it) and the reference DDP
reducer (which reads it), so that neither package imports the other.
"""

from __future__ import annotations

import threading
from typing import Protocol

import torch


class GradStore(Protocol):
    """What the reducer needs of a context: a leaf's gradient, read and replaced (torch's runGradCallbackForVariable)."""

    def get_grad(self, variable: torch.Tensor) -> torch.Tensor | None: ...

    def set_grad(self, variable: torch.Tensor, grad: torch.Tensor) -> None: ...


_local = threading.local()


def current() -> GradStore | None:
    """The context of the distributed backward whose leaf hooks run on this thread now, or None."""
    return getattr(_local, "store", None)


def enter(store: GradStore | None) -> GradStore | None:
    """Make ``store`` this thread's context; returns the previous one for ``leave``."""
    previous = current()
    _local.store = store
    return previous


def leave(previous: GradStore | None) -> None:
    _local.store = previous
