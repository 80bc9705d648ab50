"""The agent this process runs now: one slot, filled by ``api.init_rpc``, read by whatever acts on it.

It sits below every other module of the package (it imports none of them),
so rref.py and calls.py reach the running agent without importing api.py,
which imports them: the package's imports form no cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .agent import Agent

# torch/distributed/rpc/api.py _require_initialized
NOT_INITIALIZED = "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first."

_agent: Agent | None = None


def agent() -> Agent:
    """The running agent; torch's error when there is none (never started, or shut down)."""
    running = _agent
    if running is None or running.stopped:
        raise RuntimeError(NOT_INITIALIZED)
    return running


def peek() -> Agent | None:
    """The agent in the slot, running or stopped (None when there is none)."""
    return _agent


def install(new: Agent | None) -> None:
    """Put ``new`` in the slot (None empties it)."""
    global _agent
    _agent = new
