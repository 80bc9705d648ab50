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
from backends.reference.process_group import ReferenceProcessGroup


def register_reference(name: str, cls: type) -> object:
    """Register ``cls`` (a ReferenceProcessGroup subclass) as backend ``name``; return its spec."""

    def create(dist_options, backend_options):
        return cls(dist_options.store, dist_options.group_rank, dist_options.group_size, dist_options.timeout,
                   global_ranks=list(dist_options.global_ranks_in_group) or None,
                   enable_reconfigure=getattr(dist_options, "enable_reconfigure", False))

    if name.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(name, create, extended_api=True, devices=["cpu"])
    summary = (cls.__doc__ or "").strip().splitlines()
    return dataclasses.replace(
        REFERENCE_SPEC,
        name=name,
        gaps=(),
        inherits="reference",  # the registry adds the reference's gaps (backends/spec.py): none copied here
        description=f"reference with a seeded bug: {summary[0] if summary else cls.__name__}",
    )


__all__ = ["ReferenceProcessGroup", "register_reference"]
