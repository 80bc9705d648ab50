"""Registering a subclass of the reference process group as a seeded-bug backend.

The reference backend is the oracle the suites trust; planting bugs in it
shows the suites would notice if the oracle itself went wrong. A seeded
backend inherits the reference's gaps (``inherits="reference"``), so its
known deviations stay xfails and only the planted bug shows.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from backends.reference import DISTCONFORM_SPEC as REFERENCE_SPEC
from backends.reference import creator
from backends.reference.process_group import ReferenceProcessGroup


def register_reference(name: str, cls: type, create=None) -> object:
    """Register ``cls`` (a ReferenceProcessGroup subclass) as backend ``name``, made as the reference makes its
    groups unless ``create`` (a c10d creator) plants a bug there; return its spec."""
    if name.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(name, create or creator(cls), extended_api=True, devices=["cpu"])
    summary = (cls.__doc__ or "").strip().splitlines()
    return dataclasses.replace(
        REFERENCE_SPEC,
        name=name,
        gaps=(),
        inherits="reference",  # the registry adds the reference's gaps (backends/spec.py): none copied here
        description=f"reference with a seeded bug: {summary[0] if summary else cls.__name__}",
    )


def with_mesh(mesh_class: type, doc: str) -> type:
    """A ReferenceProcessGroup whose connections are a ``mesh_class`` (a Mesh subclass that plants a bug): the
    group's own mesh, its class swapped wherever the group reaches it."""

    class Planted(ReferenceProcessGroup):
        @property
        def mesh(self):
            mesh = super().mesh
            mesh.__class__ = mesh_class
            return mesh

    Planted.__doc__ = doc
    Planted.__name__ = Planted.__qualname__ = f"With{mesh_class.__name__}"
    return Planted


__all__ = ["ReferenceProcessGroup", "register_reference", "with_mesh"]
