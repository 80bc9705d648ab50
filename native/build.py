"""Build (once) and load the native extension with torch.utils.cpp_extension.

There is one build: the seeded bugs (tests/seeded/native_*.py) are planted at
run time by the module's ``create(..., planted_bug=name)`` (native.hpp,
PlantedBug), not compiled in. Its folder is
``native/build/<torch version>-<hash of the sources and flags>`` (git-ignored),
so a new torch or an edited source gets a fresh build and an unchanged
checkout reuses the last one. Concurrent builders (the pytest
controller, xdist workers, a second pytest) take a file lock on that folder:
one compiles, the others wait and then load its result. A failed build raises
``BuildFailed`` whose message is one line naming the compiler's first error,
and is remembered so each process reports it once instead of recompiling.

``Extension`` is that machinery for any extension of this project: native's
(``NATIVE``, this module's ``load()``) and the dcdev device's
(native/device/build.py).
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
from typing import Callable

HERE = Path(__file__).resolve().parent
SOURCES = ("segment.cpp", "collectives.cpp", "p2p.cpp", "work.cpp", "recorder.cpp", "register.cpp")
HEADERS = ("native.hpp", "recorder.hpp")
BUILD_ROOT = HERE / "build"
# -fwrapv: integer reductions wrap around like torch's own same-width arithmetic
CFLAGS = ("-O3", "-fwrapv", "-std=c++17")
MODULE_NAME = "distconform_native"

LAST_BUILD_SECONDS: float | None = None  # seconds this process spent compiling native, if it did


class BuildFailed(RuntimeError):
    """The extension did not compile; the message is one line naming the first compiler error."""


def for_torch(cflags: tuple[str, ...]) -> tuple[str, ...]:
    """``cflags`` as this torch's headers need them: torch 2.14's ATen requires C++20 ('#error C++20 or later
    compatible compiler is required to use ATen.', measured on 2.14.1), earlier releases build as C++17."""
    import torch
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__) < "2.14":
        return cflags
    return tuple("-std=c++20" if flag == "-std=c++17" else flag for flag in cflags)


def key_dir(here: Path, files: tuple[str, ...], cflags: tuple[str, ...], root: Path) -> Path:
    """``root/torch<version>-<hash of the files' names and contents and the flags>``: the build's cache key."""
    import torch

    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (here / name).read_bytes())
    digest.update(" ".join(for_torch(cflags)).encode())
    return root / f"torch{torch.__version__}-{digest.hexdigest()[:12]}"


def build_dir() -> Path:
    """The native backend's build folder."""
    return key_dir(HERE, SOURCES + HEADERS, CFLAGS, BUILD_ROOT)


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


class Extension:
    """One extension built and cached as the module docstring says (native's, native/device's)."""

    def __init__(self, label: str, module_name: str, folder: Callable[[], Path], sources: Callable[[], list[str]],
                 include: Path, cflags: tuple[str, ...]):
        self.label, self.module_name, self.folder, self.sources = label, module_name, folder, sources
        self.include, self.cflags = include, cflags
        self._loaded: ModuleType | None = None
        self._failed: str | None = None  # the reason of this process's failed build, reported instead of recompiling
        self.last_build_seconds: float | None = None  # seconds this process spent compiling it, if it did

    def load(self) -> ModuleType:
        """The compiled extension, building it first if this checkout never did."""
        if self._loaded is not None:
            return self._loaded
        if self._failed is not None:
            raise BuildFailed(self._failed)
        directory = self.folder()
        library = directory / f"{self.module_name}.so"
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory.parent / f"{directory.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per folder; the others wait, then load its result
            try:
                module = _import(library, self.module_name) if library.exists() else self._compile(directory)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        self._loaded = module
        return module

    def finished(self) -> bool:
        """A build of this checkout's sources is on disk, complete (its build-seconds is written after the load that
        follows the compile): load() will only load it. Asks nothing of the lock and loads nothing."""
        directory = self.folder()
        return (directory / "build-seconds").exists() and (directory / f"{self.module_name}.so").exists()

    def _compile(self, directory: Path) -> ModuleType:
        from torch.utils import cpp_extension

        os.environ.setdefault("MAX_JOBS", "2")
        started = time.monotonic()
        try:
            module = cpp_extension.load(
                name=self.module_name,
                sources=self.sources(),
                extra_cflags=list(for_torch(self.cflags)),
                extra_include_paths=[str(self.include)],
                build_directory=str(directory),
                with_cuda=False,
                verbose=False,
            )
        except Exception as exc:  # compiler errors come back as the text of a RuntimeError
            reason = f"{self.label} build failed: {first_error(str(exc))}"
            self._failed = reason
            raise BuildFailed(reason) from None
        self.last_build_seconds = time.monotonic() - started
        (directory / "build-seconds").write_text(f"{self.last_build_seconds:.1f}\n")
        return module


NATIVE = Extension("native", MODULE_NAME, build_dir, lambda: [str(HERE / s) for s in SOURCES], HERE, CFLAGS)


def load() -> ModuleType:
    """The native backend's compiled extension, building it first if this checkout never did."""
    global LAST_BUILD_SECONDS
    module = NATIVE.load()
    LAST_BUILD_SECONDS = NATIVE.last_build_seconds
    return module


def finished() -> bool:
    """native's build is on disk and complete (Extension.finished)."""
    return NATIVE.finished()
