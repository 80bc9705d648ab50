"""What a run sees of how it was started (tests/test_warm_runs.py): ``python -m tests.harness_cases.warm_probe CODE``
prints one JSON line and exits with CODE (a negative CODE: killed by that signal)."""

from __future__ import annotations

import json
import os
import signal
import sys

if __name__ == "__main__":
    print(json.dumps({
        "argv": sys.argv[1:], "argv0": os.path.basename(sys.argv[0]), "main": __name__, "cwd": os.getcwd(),
        "path0": sys.path[0], "path": [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p],
        "on_path": [p for p in sys.path if p in os.environ.get("PYTHONPATH", "").split(os.pathsep)],
        "probe_env": os.environ.get("DISTCONFORM_WARM_PROBE"), "leader": os.getpgid(0) == os.getpid(),
        "torch_preloaded": "torch" in sys.modules, "stdin": sys.stdin.readline().strip(),
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    code = int(sys.argv[1])
    if code < 0:
        os.kill(os.getpid(), -code)
        signal.pause()
    sys.exit(code)
