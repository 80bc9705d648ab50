"""Seeded bug: the TensorPipe agent is started without the device maps its accelerator ranks need.

The harness gives a TensorPipe agent on CUDA ranks ``device_maps`` from its own
device to each peer's (backends/rpc_agents.py:device_maps); this bug maps
nothing (a plausible slip: maps built only for multi-GPU ranks). Caught by
the device-map clause: TensorPipe refuses the CUDA tensor instead of moving it
to the callee's device. Needs a CUDA GPU (its record's ``needs``): the gallery skips
it elsewhere, saying so; the GPU lane runs it.
"""

import dataclasses

from backends import rpc_agents
from backends.builtin import BUILTIN_SPECS


def _no_maps(rank, devices):
    return {}  # BUG: accelerator ranks get no device maps


rpc_agents.device_maps = _no_maps  # start_tensorpipe looks it up at every start, in pytest and in every rank

DISTCONFORM_SPEC = dataclasses.replace(BUILTIN_SPECS["gloo-cuda"], name="rpc_device_map_dropped", gaps=(),
                                       inherits="gloo-cuda",
                                       description="gloo-cuda, with TensorPipe agents started without device maps")
