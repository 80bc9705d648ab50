"""Build (once) and load the dcdev device extension: native/build.py's cache, lock and one-line errors.

Its folder is ``native/device/build/<torch version>-<hash of the sources and flags>`` (git-ignored).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from native.build import BuildFailed, Extension, key_dir

HERE = Path(__file__).resolve().parent
SOURCES = ("device.cpp", "staged.cpp")
HEADERS = ("device.hpp",)
BUILD_ROOT = HERE / "build"
CFLAGS = ("-O2", "-std=c++17")
MODULE_NAME = "distconform_dcdev"

__all__ = ("BuildFailed", "build_dir", "finished", "load")


def build_dir() -> Path:
    return key_dir(HERE, SOURCES + HEADERS, CFLAGS, BUILD_ROOT)


DEVICE = Extension("dcdev", MODULE_NAME, build_dir, lambda: [str(HERE / s) for s in SOURCES], HERE, CFLAGS)


def load() -> ModuleType:
    """The compiled device extension (building it first if this checkout never did)."""
    return DEVICE.load()


def finished() -> bool:
    """The device's build is on disk and complete (native.build.Extension.finished)."""
    return DEVICE.finished()
