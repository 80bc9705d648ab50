"""A third-party plugin that wraps gloo and says so: ``--backend-plugin tests.harness_cases.gloo_heir``.

It registers ``gloo_heir`` (gloo underneath, like plugin_backend.py) and
declares a spec with no gaps of its own but ``inherits="gloo"``: gloo's known
gaps must then apply to it (strict xfails naming gloo), so a wrapper's run
shows only the wrapper's own bugs. plugin_backend.py is the same backend
without a spec: held to the full contract, gloo's gaps fail there.
"""

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from backends.spec import BackendSpec

NAME = "gloo_heir"


def _create(store, rank, world_size, timeout):
    return ProcessGroupGloo(store, rank, world_size, timeout)


if NAME.upper() not in dist.Backend._plugins:  # importing twice must not fail
    dist.Backend.register_backend(NAME, _create, devices=["cpu"])

DISTCONFORM_SPEC = BackendSpec(name=NAME, inherits="gloo", description="gloo registered as a plugin, gloo's gaps inherited")
