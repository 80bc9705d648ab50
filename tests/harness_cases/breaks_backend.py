"""A plugin whose declared gap breaks its backend, and the cases that show the harness replacing the world.

``--backend-plugin tests.harness_cases.breaks_backend --backend gloo_breaks`` with this file as the test
path: ``gloo_breaks`` is gloo registered as a plugin whose spec declares the deviation of
``test_breaks_the_backend`` with ``consequence="breaks_backend"`` (as NCCL's dtype refused inside an NCCL group
call). Each case writes its ranks' process ids to the file named by $DISTCONFORM_TEST_PIDS: the case before
it shares its world, the case after it must get new processes (tests/test_specs.py).
"""

import json
import os

import pytest
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from backends.spec import BackendSpec, Gap

NAME = "gloo_breaks"
PIDS_ENV = "DISTCONFORM_TEST_PIDS"


def _create(store, rank, world_size, timeout):
    return ProcessGroupGloo(store, rank, world_size, timeout)


if NAME.upper() not in dist.Backend._plugins:  # importing twice must not fail
    dist.Backend.register_backend(NAME, _create, devices=["cpu"])

CORRUPTS = "gloo_corrupts"  # the same, its deviation declared as a heap it corrupts: a rank crashes later
if CORRUPTS.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(CORRUPTS, _create, devices=["cpu"])

DISTCONFORM_SPEC = [
    BackendSpec(name=NAME, description="gloo as a plugin whose one declared deviation leaves the backend broken",
                gaps=(Gap({"clause": "test_breaks_the_backend"}, "the deviation leaves the backend broken",
                          consequence="breaks_backend"),)),
    BackendSpec(name=CORRUPTS, description="gloo as a plugin whose one declared deviation corrupts a rank's heap",
                gaps=(Gap({"clause": "test_breaks_the_backend"}, "the deviation corrupts the heap: a rank crashes "
                          "later", consequence="kills_rank"),)),
]


def _record(name: str, world) -> None:
    with open(os.environ[PIDS_ENV], "a") as fh:
        fh.write(json.dumps([f"{world.name}/{name}", world.run(os.getpid)]) + "\n")


def test_before(world):
    _record("before", world)


@pytest.mark.needs(clause="test_breaks_the_backend")
def test_breaks_the_backend(world):
    _record("breaks", world)
    raise AssertionError("the declared deviation")


def test_after(world):
    _record("after", world)
