"""Registering the native (C++) backend with a seeded bug planted.

The native extension is built once and holds every planted bug (native.hpp,
PlantedBug); a bug module registers the backend under its own name with one
of them, which ``create(..., planted_bug=...)`` plants at run time for the
rank process when its group is made. The gallery's runs share the one build
(native/build.py, the pytest controller's availability check builds it if
this checkout never did), and a build that fails leaves the backend
unavailable with the compiler's first error as the reason.
"""

from __future__ import annotations

import native


def register_native_bug(name: str, planted_bug: str, summary: str):
    """Register the native backend with ``planted_bug`` under backend ``name``; return its spec."""
    return native.register(name, planted_bug, description=f"native with a seeded bug: {summary}")
