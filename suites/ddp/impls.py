"""The DDP implementations under test, behind one adapter, and what each knowingly lacks.

Two implementations run every clause on the backend under test:

* ``torch``: ``torch.nn.parallel.DistributedDataParallel`` (its C++ Reducer);
* ``reference``: ``backends.reference.ddp.DistributedDataParallel``, the
  project's plain-Python reducer (the oracle for DDP behaviour).

Both take torch's constructor arguments and work inside torch's
``torch.distributed.algorithms.Join``. What differs is only how their buckets
are observed: the reference reducer exposes ``bucket_indices()``,
``bucket_numels()`` and ``managed_parameters()``; torch's are read from its
reducer's GradBuckets (``reducer._get_zeros_like_grad_buckets()``: reducer
order, each bucket's parameters and flat buffer), mapped to managed-parameter
indices by torch's own managed-parameter walk (``managed_parameters``).

What a backend lacks under one implementation is that backend's gap with
``impl=`` (a case's ``impl`` parameter is one of its requirements,
backends/spec.py). A reducer that cannot be imported makes its cases skip
with the import error as the reason.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from backends.spec import REQUIREMENT_KEYS

IMPLS: tuple[str, ...] = REQUIREMENT_KEYS["impl"].values or ()  # the requirement vocabulary names them
REFERENCE_MODULE = "backends.reference.ddp"

# A backend-level requirement (matched against the backend spec's gaps): torch's C++
# reducer keeps the Work of Join's per-forward all-reduce and waits on it in backward
# (divide_by_initial_world_size=False), after Python has dropped its reference. A
# backend whose Works are Python objects must keep them working from C++ alone.
WORK_HELD_BY_CPP = {"work": "held_by_cpp"}


def needs_of(impl: str, divide_by_initial_world_size: bool = True) -> dict:
    """Backend requirements of a Join case beyond the suite's own."""
    return WORK_HELD_BY_CPP if impl == "torch" and not divide_by_initial_world_size else {}


def unavailable_reason(impl: str) -> str:
    """Why ``impl`` cannot run here ("" if it can)."""
    if impl == "torch":
        return ""
    try:
        module = importlib.import_module(REFERENCE_MODULE)
        module.DistributedDataParallel  # noqa: B018 - the interface the suite needs
    except Exception as exc:  # ImportError, AttributeError, or a broken module
        return f"reference reducer not usable: importing {REFERENCE_MODULE}.DistributedDataParallel failed: {exc!r}"
    return ""


def impl_params(impls=IMPLS) -> list:
    """pytest params for ``impl``, with a skip naming the reason when one is not usable."""
    params = []
    for impl in impls:
        reason = unavailable_reason(impl)
        params.append(pytest.param(impl, id=impl, marks=[pytest.mark.skip(reason=reason)] if reason else []))
    return params


# ---------------------------------------------------------------- rank side
def ddp_class(impl: str):
    if impl == "torch":
        return torch.nn.parallel.DistributedDataParallel
    if impl == "reference":
        return importlib.import_module(REFERENCE_MODULE).DistributedDataParallel
    raise ValueError(f"unknown DDP implementation {impl!r} (known: {', '.join(IMPLS)})")


def wrap(impl: str, module: torch.nn.Module, **options):
    """``module`` moved to this rank's device and wrapped by ``impl``'s DDP over the default group."""
    from fixtures.rank import ctx

    device = torch.device(ctx.device)
    module = module.to(device)
    if device.type != "cpu":  # a single-device module on an accelerator (CUDA or a vendor's) names its device
        options.setdefault("device_ids", [device.index])
    return ddp_class(impl)(module, **options)


def ignore_parameters(impl: str, module: torch.nn.Module, names) -> None:
    """parameters_to_ignore: the names (``"{module}.{param}"``) DDP must leave local."""
    ddp_class(impl)._set_params_and_buffers_to_ignore_for_model(module, list(names))


def managed_parameters(ddp) -> list:
    """The parameters the reducer manages, in managed-index order."""
    if hasattr(ddp, "managed_parameters"):  # the reference reducer says so itself
        return list(ddp.managed_parameters())
    # torch: the walk of DistributedDataParallel._build_params_for_reducer (spec A1), without
    # its side effects: per module, its own trainable parameters not ignored, shared ones once
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    seen, managed = set(), []
    for mod_name, mod in ddp.module.named_modules():
        for name, p in mod.named_parameters(recurse=False):
            if p.requires_grad and f"{mod_name}.{name}" not in ignored and id(p) not in seen:
                seen.add(id(p))
                managed.append(p)
    return managed


def bucket_indices(ddp) -> list[list[int]]:
    """Managed-parameter indices of each bucket, in reducer order."""
    if hasattr(ddp, "bucket_indices"):
        return [list(b) for b in ddp.bucket_indices()]
    managed = managed_parameters(ddp)
    position = {id(p): i for i, p in enumerate(managed)}
    return [[position[id(p)] for p in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def bucket_numels(ddp) -> list[int]:
    """Number of elements of each bucket's flat buffer, in reducer order."""
    if hasattr(ddp, "bucket_numels"):
        return [int(n) for n in ddp.bucket_numels()]
    return [bucket.buffer().numel() for bucket in ddp.reducer._get_zeros_like_grad_buckets()]
