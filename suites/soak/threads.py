"""Running rank-side work on several threads at once, every wait under a deadline.

A thread still running at the deadline is reported with its Python stack instead of being waited for:
the clause fails with a ``ThreadsStuck`` naming where each thread blocks, and the harness replaces the
world (a hung collective cannot be cancelled from Python).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable


class ThreadsStuck(TimeoutError):
    """Threads of a rank did not finish within their deadline."""


def run_threads(jobs: dict[str, Callable[[], object]], deadline_s: float) -> dict[str, object]:
    """Run each job on its own thread at once; return name -> result, or raise the first failure.

    Raises ``ThreadsStuck`` with the stuck threads' stacks when any is still running after ``deadline_s``."""
    results: dict[str, object] = {}
    errors: dict[str, BaseException] = {}

    def body(name: str, job: Callable[[], object]) -> None:
        try:
            results[name] = job()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the calling thread
            errors[name] = exc

    threads = {name: threading.Thread(target=body, args=(name, job), name=f"soak-{name}", daemon=True)
               for name, job in jobs.items()}
    for thread in threads.values():
        thread.start()
    end = time.monotonic() + deadline_s
    for thread in threads.values():
        thread.join(max(0.0, end - time.monotonic()))
    stuck = {name: t for name, t in threads.items() if t.is_alive()}
    if stuck:
        frames = sys._current_frames()
        stacks = "\n".join(f"thread {name}:\n" + "".join(traceback.format_stack(frames[t.ident])[-6:])
                           for name, t in stuck.items() if t.ident in frames)
        raise ThreadsStuck(f"{len(stuck)} of {len(threads)} threads still running after {deadline_s:.0f} s "
                           f"(a deadlock or a lost message): {', '.join(stuck)}\n{stacks}")
    for name, exc in errors.items():
        raise RuntimeError(f"thread {name}: {exc!r}") from exc
    return results
