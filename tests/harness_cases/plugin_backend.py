"""A third-party-style backend plugin: ``--backend-plugin tests.harness_cases.plugin_backend``.

It registers ``plugin_gloo`` (gloo underneath) with torch and declares no
DISTCONFORM_SPEC, so the harness must hold it to the full contract: gloo's
known gaps are recorded for "gloo" only, and must not excuse this backend.
"""

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

NAME = "plugin_gloo"


def _create(store, rank, world_size, timeout):
    return ProcessGroupGloo(store, rank, world_size, timeout)


if not hasattr(dist.Backend, NAME.upper()):  # importing twice must not fail
    dist.Backend.register_backend(NAME, _create, devices=["cpu"])
