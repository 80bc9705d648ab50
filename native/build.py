"""Build (once) and load the native extension with torch.utils.cpp_extension.

The build folder is ``native/build/<torch version>-<variant>-<hash of the sources and flags>``
(git-ignored), so a new torch or an edited source gets a fresh build and an
unchanged checkout reuses the last one. Concurrent builders (the pytest
controller, xdist workers, a second pytest) take a file lock on that folder:
one compiles, the others wait and then load its result. A failed build raises
``BuildFailed`` whose message is one line naming the compiler's first error,
and is remembered so each process reports it once instead of recompiling.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
SOURCES = ("segment.cpp", "collectives.cpp", "p2p.cpp", "work.cpp", "register.cpp")
HEADERS = ("native.hpp",)
BUILD_ROOT = HERE / "build"
# -fwrapv: integer reductions wrap around like torch's own same-width arithmetic
CFLAGS = ("-O3", "-fwrapv", "-std=c++17")
# Seeded bugs (tests/seeded/native_*.py): each variant is its own build with one define.
VARIANTS = {
    "": (),
    "skip_last_rank": ("-DNATIVE_BUG_SKIP_LAST_RANK",),
    "early_completion": ("-DNATIVE_BUG_EARLY_COMPLETION",),
    "no_timeout": ("-DNATIVE_BUG_NO_TIMEOUT",),
    "any_source_rank0": ("-DNATIVE_BUG_ANY_SOURCE_RANK0",),
    "premul_first_only": ("-DNATIVE_BUG_PREMUL_FIRST_ONLY",),
    "complex_as_real": ("-DNATIVE_BUG_COMPLEX_AS_REAL",),
    "abort_waits": ("-DNATIVE_BUG_ABORT_WAITS",),
    "shrink_ignores_options": ("-DNATIVE_BUG_SHRINK_IGNORES_OPTIONS",),
    "shrink_waits_for_excluded": ("-DNATIVE_BUG_SHRINK_WAITS_FOR_EXCLUDED",),
}

_LOADED: dict[str, ModuleType] = {}
_FAILED: dict[str, str] = {}
LAST_BUILD_SECONDS: dict[str, float] = {}  # variant -> seconds this process spent compiling it


class BuildFailed(RuntimeError):
    """The extension did not compile; the message is one line naming the first compiler error."""


def _flags(variant: str) -> tuple[str, ...]:
    if variant not in VARIANTS:
        raise ValueError(f"unknown native variant {variant!r}; known: {', '.join(repr(v) for v in VARIANTS)}")
    return CFLAGS + VARIANTS[variant]


def build_dir(variant: str = "") -> Path:
    import torch

    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    digest.update(" ".join(_flags(variant)).encode())
    return BUILD_ROOT / f"torch{torch.__version__}-{variant or 'clean'}-{digest.hexdigest()[:12]}"


def module_name(variant: str = "") -> str:
    return f"distconform_native_{variant or 'clean'}"


def _import(path: Path, name: str) -> ModuleType:
    import torch  # noqa: F401  (the extension links against torch's libraries)

    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def first_error(text: str) -> str:
    """The first line of compiler output that says what went wrong."""
    for pattern in (r"^.*\berror\b:.*$", r"^.*\bfatal error\b.*$", r"^.*undefined (symbol|reference).*$"):
        match = re.search(pattern, text, re.MULTILINE)
        if match:
            return match.group(0).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no compiler output"


def load(variant: str = "") -> ModuleType:
    """The compiled extension for ``variant``, building it first if this checkout never did."""
    if variant in _LOADED:
        return _LOADED[variant]
    if variant in _FAILED:
        raise BuildFailed(_FAILED[variant])
    directory, name = build_dir(variant), module_name(variant)
    library = directory / f"{name}.so"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per folder; the others wait, then load its result
        try:
            module = _import(library, name) if library.exists() else _compile(variant, directory, name)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _LOADED[variant] = module
    return module


def _compile(variant: str, directory: Path, name: str) -> ModuleType:
    from torch.utils import cpp_extension

    os.environ.setdefault("MAX_JOBS", "2")
    started = time.monotonic()
    try:
        module = cpp_extension.load(
            name=name,
            sources=[str(HERE / s) for s in SOURCES],
            extra_cflags=list(_flags(variant)),
            extra_include_paths=[str(HERE)],
            build_directory=str(directory),
            with_cuda=False,
            verbose=False,
        )
    except Exception as exc:  # compiler errors come back as the text of a RuntimeError
        reason = f"native build failed: {first_error(str(exc))}"
        _FAILED[variant] = reason
        raise BuildFailed(reason) from None
    LAST_BUILD_SECONDS[variant] = time.monotonic() - started
    (directory / "build-seconds").write_text(f"{LAST_BUILD_SECONDS[variant]:.1f}\n")
    return module
