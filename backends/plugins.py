"""Importing a plugin module and reading what it declares: the one path of --backend-plugin and --rpc-agent-plugin."""

from __future__ import annotations

import importlib


def declared_by(module_name: str, attribute: str, *, option: str, error: type[ImportError]) -> list | None:
    """Import ``module_name``; what it declares as ``attribute``, as a list (None: it declares nothing).

    A module that fails to import raises ``error`` naming the option and the
    module, with the import's own exception, never a traceback from inside
    pytest's start-up.
    """
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise error(f"{option} {module_name}: import failed: {exc!r}") from exc
    declared = getattr(module, attribute, None)
    if declared is None:
        return None
    return list(declared) if isinstance(declared, (list, tuple)) else [declared]
