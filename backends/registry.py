"""Which backends exist: built-in specs, the reference backend, and plugins.

A plugin is a module named by ``--backend-plugin``. Importing it must call
``torch.distributed.Backend.register_backend``; it may also define
``DISTCONFORM_SPEC`` (a BackendSpec, or a list of them) to declare its
capabilities. Without one the backend gets a spec with no gaps: it is held to
the full contract. A spec with ``inherits="gloo"`` gets gloo's gaps after its
own (resolved here, once every spec is known, so a plugin may inherit from
another plugin or from the reference backend too).
"""

from __future__ import annotations


from .builtin import BUILTIN_SPECS
from .mixed import BadBackendString, device_spec, is_qualified
from .plugins import declared_by
from .spec import Availability, BackendSpec, inherit

# Modules that, when importable, contribute backends of this project.
PROJECT_BACKEND_MODULES = ("backends.reference", "native")


class UnknownBackend(ValueError):
    pass


class PluginImportError(ImportError):
    pass


def load_plugin(module_name: str) -> list[BackendSpec]:
    """Import a plugin module (registering its backend) and return the specs it declares."""
    return declared_by(module_name, "DISTCONFORM_SPEC", option="--backend-plugin", error=PluginImportError) or []


def _project_specs() -> list[BackendSpec]:
    specs: list[BackendSpec] = []
    for module_name in PROJECT_BACKEND_MODULES:
        try:
            specs += load_plugin(module_name)
        except PluginImportError as exc:
            if isinstance(exc.__cause__, ModuleNotFoundError) and exc.__cause__.name == module_name:
                continue  # not built yet in this checkout
            raise
    return specs


def _registered_plugin_names() -> list[str]:
    """Backends registered with torch by any imported module (names are stored upper-case)."""
    import torch.distributed as dist

    return sorted(name.lower() for name in getattr(dist.Backend, "_plugins", {}))


def _plugin_device_type(name: str) -> str:
    import torch.distributed as dist

    devices = dist.Backend.backend_capability.get(name.lower(), ["cpu"])
    return "cpu" if "cpu" in devices else devices[0]


class BackendRegistry:
    """Resolves backend names to specs; built once per pytest session (and per rank)."""

    def __init__(self, plugin_modules: list[str] | tuple[str, ...] = ()):
        self.plugin_modules = tuple(plugin_modules)
        self.specs: dict[str, BackendSpec] = dict(BUILTIN_SPECS)
        for spec in _project_specs():
            self.specs[spec.name] = spec
        for module_name in self.plugin_modules:
            for spec in load_plugin(module_name):
                self.specs[spec.name] = spec
        for name in _registered_plugin_names():
            if name not in self.specs:
                self.specs[name] = BackendSpec(
                    name=name,
                    device_type=_plugin_device_type(name),
                    check_available=lambda: Availability(True),
                    description="plugin backend without a spec: held to the full contract",
                    has_spec=False,
                )
        for name in list(self.specs):
            self.specs[name] = self._resolve(name, ())

    def _resolve(self, name: str, chain: tuple[str, ...]) -> BackendSpec:
        """The spec of ``name`` with the gaps of every backend it inherits from."""
        spec = self.specs[name]
        if not spec.inherits or spec.inherited_gaps:
            return spec
        if spec.inherits in chain + (name,):
            raise UnknownBackend(f"backend {name!r} inherits gaps in a cycle: {' -> '.join(chain + (name, spec.inherits))}")
        if spec.inherits not in self.specs:
            raise UnknownBackend(f"backend {name!r} inherits the gaps of unknown backend {spec.inherits!r}; "
                                 f"known backends: {', '.join(self.known)}")
        parent = self._resolve(spec.inherits, chain + (name,))
        self.specs[spec.inherits] = parent
        return inherit(spec, parent)

    @property
    def known(self) -> list[str]:
        return sorted(name for name in self.specs if not is_qualified(name))  # not the strings built from them

    def get(self, name: str) -> BackendSpec:
        """The spec of backend ``name``, or of one device's world of a device-qualified string
        (``cpu:gloo``, ``cpu:gloo,cuda:nccl@cuda``: backends/mixed.py), built from the specs of its parts."""
        if name not in self.specs and is_qualified(name):
            try:
                self.specs[name] = device_spec(name, self.get)
            except BadBackendString as exc:
                raise UnknownBackend(str(exc)) from None
        try:
            return self.specs[name]
        except KeyError:
            raise UnknownBackend(
                f"unknown backend {name!r}; known backends: {', '.join(self.known)} "
                "(load others with --backend-plugin MODULE)"
            ) from None
