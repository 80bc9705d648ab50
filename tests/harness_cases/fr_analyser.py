"""torch's flight-recorder analyser (fr_trace) run in the test's own process, for the tests that read kept dumps.

``python -m torch.distributed.flight_recorder.fr_trace DIR --prefix rank_`` is ``fr_trace.main`` on those
arguments; a subprocess would import torch once more (about 3 s of CPU) to run it.
"""

from __future__ import annotations

import contextlib
import io
import logging


def fr_trace_output(folder, prefix: str = "rank_") -> str:
    """What ``fr_trace FOLDER --prefix PREFIX`` prints and logs; an error it meets (the command's non-zero exit,
    a usage error's SystemExit) propagates."""
    from torch.distributed.flight_recorder import fr_trace

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("Flight Recorder")  # fr_trace's own logger (components/fr_logger.py)
    logger.addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            fr_trace.main([str(folder), "--prefix", prefix])
    finally:
        logger.removeHandler(handler)
    return out.getvalue()
