"""The functions the RPC stress benchmark calls remotely (module-level, so every agent can pickle them).

``light`` and ``heavy`` are torch's own stress-test bodies
(torch/testing/_internal/distributed/rpc/rpc_test.py: ``light_rpc`` and
``heavy_rpc``): both return 0, which the benchmark checks for every call.

``stall`` and ``wrong`` are test hooks (``--plant AGENT:stall|wrong``): an agent
whose calls never come back, and one whose answers are wrong, so the tests can
check that a hung agent becomes an error row and not a stuck run, and that
wrong answers are counted. ``stall`` waits on an event instead of sleeping, so
stopping the agent (rpc_bench.stop) can release the worker threads it holds;
otherwise a graceful or even an ungraceful shutdown would wait for them.
"""

from __future__ import annotations

import threading

_release = threading.Event()


def light() -> int:
    return 0


def heavy(tensor) -> int:
    for i in range(1, 100):
        tensor *= i
        tensor /= i + 1
    return 0


def stall(seconds: float = 3600.0) -> int:
    """Hold the callee's worker thread until released (or ``seconds`` pass), then answer 0."""
    _release.wait(seconds)
    return 0


def wrong() -> int:
    """What a broken agent might deliver: an answer other than light()'s 0."""
    return 1


def release_stalls() -> None:
    """Let every stalled call in this process finish (called before an agent is stopped)."""
    _release.set()


def arm_stalls() -> None:
    """Make the next stall() wait again (called when an agent starts)."""
    _release.clear()


UDFS = {"light": light, "heavy": heavy, "stall": stall, "wrong": wrong}
