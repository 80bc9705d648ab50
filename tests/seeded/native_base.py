"""Registering a seeded-bug variant of the native (C++) backend.

Each variant is the native extension compiled with one ``NATIVE_BUG_*``
define (native/build.py VARIANTS), in its own build folder. Importing a bug
module builds its variant right away, in the process that imports it (the
gallery's pytest process), so the timed subprocess run only loads it; a
variant that does not compile leaves the backend unavailable with the
compiler's first error as the reason.
"""

from __future__ import annotations

import native
from native import build


def register_native_variant(name: str, variant: str, summary: str):
    """Register the native extension built as ``variant`` under backend ``name``; return its spec."""
    try:
        build.load(variant)
    except build.BuildFailed:
        pass  # the spec's availability reports it
    return native.register(name, variant, description=f"native with a seeded bug: {summary}")
