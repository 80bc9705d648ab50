"""A vendor's accelerator on a CPU-only machine: the ``dcdev`` device and the ``native-dcdev`` backend for it.

Loaded as a vendor's plugin is, ``--backend-plugin native.device``: importing it builds (once, cached like the
native backend: build.py) and registers the device (runtime.py: PrivateUse1 renamed ``dcdev``, ``torch.dcdev``,
8 devices, memory the host cannot read without the device's copy, device.cpp), and registers the backend with
``register_backend("native-dcdev", ..., devices=["dcdev"])`` as Ascend's ``hccl`` is registered for ``npu``.
The backend is native's shared-memory algorithm (native/) staged through the device's copy (staged.cpp):
inputs copied off the device, the host algorithm run, results copied back before the Work completes.

Its spec (``DISTCONFORM_SPEC``) runs every clause with the ranks' tensors on ``dcdev:<local rank>``.
"""

from __future__ import annotations

import torch.distributed as dist

import native
from backends.spec import INIT_ENV, Availability, BackendSpec, Gap

from . import build, runtime

DEVICE = runtime.DEVICE
NAME = "native-dcdev"


def _creator(name: str, planted_bug: str):
    host_create = native._creator("none")

    def create(dist_options, backend_options):
        host = host_create(dist_options, backend_options)  # native's group: the host half of every operation
        return build.load().wrap(host, name=name, planted_bug=planted_bug)
    return create


def _availability(planted_bug: str):
    def check() -> Availability:
        host = native._availability("none")()
        if not host.available:
            return host
        try:
            extension = build.load()
        except build.BuildFailed as exc:
            return Availability(False, str(exc))
        if planted_bug not in extension.PLANTED_BUGS:
            return Availability(False, f"{NAME}: unknown planted bug {planted_bug!r}; known: "
                                       f"{', '.join(repr(b) for b in extension.PLANTED_BUGS)}")
        return Availability(True)
    return check


# What the device adds to native's gaps (inherited), measured on torch 2.13 at world size 2.
GAPS: tuple[Gap, ...] = (
    Gap({"feature": "shrinking"},
        "torch 2.13's shrink_group looks a group's backend up by its bound device, else by 'cuda', else by 'cpu' "
        "(_validate_shrink_backend_requirements): a lazily initialised group whose backend serves dcdev only is "
        "refused before the backend is asked: \"RuntimeError: Cannot access device backend for process group "
        "'5'. Ensure the process group was initialized with a compatible device backend and devices are "
        "available.\" (the staged backend advertises and forwards native's shrink)",
        env={INIT_ENV: "lazy"}),
    Gap({"feature": "sparse"},
        "dcdev has no sparse kernels (a test device: strided tensors only): making a sparse COO tensor on it fails "
        "with \"NotImplementedError: Could not run 'aten::_sparse_coo_tensor_with_dims_and_tensors' with "
        "arguments from the 'Sparsedcdev' backend\" before any collective"),
)


def register(name: str = NAME, planted_bug: str = "none", gaps: tuple[Gap, ...] = GAPS,
             description: str = "") -> BackendSpec:
    """Register the device and ``name`` (the staged native backend running with ``planted_bug``); its spec."""
    runtime.register()
    if name.upper() not in dist.Backend._plugins:  # importing twice must not fail
        dist.Backend.register_backend(name, _creator(name, planted_bug), extended_api=True, devices=[DEVICE])
    return BackendSpec(
        name=name,
        device_type=DEVICE,
        check_available=_availability(planted_bug),
        gaps=gaps,
        inherits="native",
        resource_budget=native.RESOURCE_BUDGET,
        after_timeout=native.AFTER_TIMEOUT,
        own_flight_recorder=native.flight_recorder.NAME,  # the staged groups are native's: native's recorder
        description=description or f"native's shared-memory algorithm for {DEVICE} tensors (PrivateUse1 test "
                                   "device, native/device/), staged through the device's copy",
    )


DISTCONFORM_SPEC = register()
