"""The facts of a run that decide how its results read: versions, host, behaviour-changing environment.

They go into conformance.json's ``meta`` and the top of every report, so two
runs can be compared knowing what differed (torch, a plugin's build, NCCL_*
or GLOO_* settings, the debug level) before comparing outcomes.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys

# Prefixes of environment variables that change what a backend or agent does.
ENV_PREFIXES = ("TORCH_", "NCCL_", "GLOO_", "UCC_", "UCX_", "DISTCONFORM_")
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
HARNESS_NAMES = ("DISTCONFORM_SESSION",)  # set by the harness itself (fixtures/spawner.py), per run
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")
PACKAGES = ("torch", "pytest", "pytest-xdist", "hypothesis", "numpy", "jinja2", "matplotlib")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def behaviour_env(environ=None) -> dict[str, str]:
    """TORCH_*, NCCL_*, GLOO_*, UCC_*, UCX_*, DISTCONFORM_* and a few launcher variables; secrets masked."""
    environ = os.environ if environ is None else environ
    out = {}
    for name, value in sorted(environ.items()):
        if (name.startswith(ENV_PREFIXES) or name in ENV_NAMES) and name not in HARNESS_NAMES:
            out[name] = "(set, value hidden)" if any(w in name.upper() for w in _SECRET_WORDS) else value
    return out


def plugin_packages(modules) -> dict[str, str]:
    """module -> 'distribution version' of the installed package that provides it, or where it was loaded from."""
    providers = importlib.metadata.packages_distributions()
    out = {}
    for module in modules or ():
        top = module.split(".")[0]
        dists = providers.get(top, [])
        if dists:
            out[module] = ", ".join(f"{d} {_version(d)}" for d in sorted(set(dists)))
        else:
            loaded = sys.modules.get(module)
            where = getattr(loaded, "__file__", None) or "not imported here"
            out[module] = f"not an installed distribution ({where})"
    return out


def debug_level() -> str:
    """torch.distributed's debug level (OFF / INFO / DETAIL), as the ranks will see it."""
    try:
        import torch.distributed as dist

        return str(dist.get_debug_level()).rsplit(".", 1)[-1]
    except Exception as exc:  # noqa: BLE001 - a fact we could not read is reported as such
        return f"unknown ({type(exc).__name__})"


def git_commit(path: str) -> str:
    """The project's commit ('+dirty' when tracked files changed); '' outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=5)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head.stdout.strip() + ("+dirty" if dirty else "")


def collect(*, started: float, root: str, plugins, args) -> dict:
    """The run facts known when the session ends (the caller adds options, wall time and exit status)."""
    return {
        "started_utc": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["pytest", *map(str, args)]),
        "torch_version": _version("torch") or getattr(sys.modules.get("torch"), "__version__", ""),
        "packages": {name: _version(name) for name in PACKAGES if _version(name)},
        "plugin_packages": plugin_packages(plugins),
        "python": platform.python_version(),
        "host": {"name": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "project_commit": git_commit(root),
        "debug_level": debug_level(),
        "env": behaviour_env(),
    }
