"""Planting a seeded bug in shared code (a reference module or class) so that it is live only in its own backend's ranks.

A bug in the reference RPC agent, distributed autograd, the DDP reducer or
the profiling envelope replaces one attribute of a module or class that
every process of a run imports. Planted plainly, it would be live in every
backend of the run, and a run holding several bugs could then credit one
bug's failure to another. ``plant`` installs one dispatcher per attribute
instead: it runs a bug's replacement in the rank processes of the backend
named after that bug (``fixtures.rank.ctx.backend``) and the original
everywhere else (the pytest process, other backends' ranks). So bug modules
that plant this way can share a gallery run (tests/test_seeded_bugs.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fixtures.rank import ctx

_BUGS = "__seeded_bugs__"  # backend name -> replacement, on the dispatcher
_ORIGINAL = "__seeded_original__"


def plant(backend: str, owner: Any, attribute: str, make_replacement: Callable[[Callable], Callable]) -> None:
    """Make ``owner.<attribute>`` behave as ``make_replacement(original)`` in the ranks of ``backend`` only.

    ``owner`` is a module or class and ``attribute`` its own (not inherited),
    so the bug lands where the code defines it. Planting the same backend again
    (a module imported twice) replaces its entry; other backends keep theirs.
    """
    current = vars(owner).get(attribute)
    if current is None:  # the code was refactored: say what to update instead of failing obscurely
        where = owner.__name__ if inspect.ismodule(owner) else f"{owner.__module__}.{owner.__qualname__}"
        raise ImportError(f"{backend}: {where} has no attribute {attribute!r} any more; "
                          f"plant the bug in its successor (tests/seeded/{backend}.py)")
    bugs: dict[str, Callable] | None = getattr(current, _BUGS, None)
    if bugs is None:
        original = current
        bugs = {}

        @functools.wraps(original)
        def dispatch(*args, **kwargs):
            return bugs.get(ctx.backend, original)(*args, **kwargs)

        setattr(dispatch, _BUGS, bugs)
        setattr(dispatch, _ORIGINAL, original)
        setattr(owner, attribute, dispatch)
    else:
        original = getattr(current, _ORIGINAL)
    bugs[backend] = functools.wraps(original)(make_replacement(original))


def planted_in(owner: Any, attribute: str) -> tuple[str, ...]:
    """The backends whose bug ``owner.<attribute>`` carries (empty: none planted)."""
    return tuple(getattr(vars(owner).get(attribute), _BUGS, {}))
