"""A --backend-plugin that catches clauses placing tensors on a device other than the rank's (issue 23).

On CPU every device looks like "cpu", so a hard-coded ``.cpu()`` or ``device="cpu"`` passes here and
breaks only on a GPU machine. Loaded in the ranks (``--backend-plugin tests.harness_cases.device_audit``
with $DEVICE_AUDIT_LOG set), this module makes the rank's device a fake one: ``ctx.device`` reads
``cpu:0``, a spelling torch accepts for the CPU but that no hard-coded device equals. A TorchFunctionMode
then follows every tensor: made with ``device=ctx.device`` or ``.to(ctx.device)`` (or computed from such a
tensor) it is *placed*; made by a factory without a device, by ``.cpu()``/``.cuda()`` or with any other
device it is not. A placed tensor's ``.device`` reads ``cpu:0``, so ``device=t.device`` stays placed. Every
torch.distributed call given a tensor that is not placed is one line of $DEVICE_AUDIT_LOG (JSON: the call,
where the tensor came from, the clause's line). Tensors made by torch or by backends/ (an implementation
under test) stay untagged and are never findings; so do nn.Module parameters (torch makes them), and
ProcessGroup methods called directly are not seen (only torch.distributed functions). Nothing is raised:
the run's outcomes stay as they are, and a clause that expects an error cannot swallow a finding.
tests/test_device_audit.py reads the log.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

FAKE_DEVICE = "cpu:0"
LOG_ENV = "DEVICE_AUDIT_LOG"
_PLACED = "_device_audit_placed"  # tensor attribute: True placed on the rank's device, False not
_ORIGIN = "_device_audit_origin"  # tensor attribute: what made an unplaced tensor


def _tensors(value) -> list:
    import torch
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _is_rank_device(device) -> bool:
    import torch

    return device is not None and torch.device(device) == torch.device(FAKE_DEVICE)


def _clause_line() -> str:
    """The innermost frame outside torch and this module: the clause (or its helper) that made the call."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("device_audit.py"):
            return f"{os.path.relpath(frame.filename)}:{frame.lineno} in {frame.name}"
    return "?"


def _direct_caller():
    """The frame that called the torch function being handled (past this module and torch's dispatch to modes)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or frame.f_code.co_filename.endswith(os.path.join("torch", "overrides.py"))):
        frame = frame.f_back
    return frame


# code that is not a clause: where torch puts its tensors (the staging tensors of object collectives, FSDP's
# device checks) and where an implementation under test does (the reference DDP follows its parameters,
# which nn.Module made) is theirs, not the clause's
LIBRARY_DIRS = (f"{os.sep}torch{os.sep}", f"{os.sep}backends{os.sep}")


def _library_placed_it() -> bool:
    """A library made the call (LIBRARY_DIRS): its tensors stay untagged, neither placed nor a finding."""
    frame = _direct_caller()
    return frame is not None and any(part in frame.f_code.co_filename for part in LIBRARY_DIRS)


def _explicit_device(func, args, kwargs) -> "tuple[bool, object]":
    """(True, device) when the call names the device of its result, else (False, None)."""
    import torch

    if func is torch.Tensor.cpu:
        return True, "cpu"
    if func is torch.Tensor.cuda:
        return True, f"cuda:{args[1]}" if len(args) > 1 and args[1] is not None else "cuda"
    if kwargs.get("device") is not None:
        return True, kwargs["device"]
    if func is torch.Tensor.to:
        for arg in args[1:]:
            if isinstance(arg, (str, torch.device)):
                return True, arg
            if isinstance(arg, torch.Tensor):  # .to(other): other's device
                return True, FAKE_DEVICE if getattr(arg, _PLACED, False) else arg.device
    return False, None


class DeviceAudit:
    """Follows which tensors are on the rank's device; records torch.distributed calls given others."""

    def __init__(self, log_path: str):
        from torch.overrides import TorchFunctionMode

        audit = self
        self.log_path = log_path

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return audit.call(func, args, kwargs or {})

        self.mode = Mode()

    def call(self, func, args, kwargs):
        import torch

        if func == torch.Tensor.device.__get__ and getattr(args[0], _PLACED, False) and not _library_placed_it():
            return torch.device(FAKE_DEVICE)  # to the clause, a placed tensor is on the rank's (fake) device
        if (getattr(func, "__module__", None) or "").startswith("torch.distributed"):
            self.check(func, args, kwargs)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if _library_placed_it():
            return out
        if func == torch.Tensor.data.__set__:  # param.data = t (Module.to): the parameter is where t is
            self.tag([args[0]], getattr(args[1], _PLACED, None), getattr(args[1], _ORIGIN, ""))
            return out
        named, device = _explicit_device(func, args, kwargs)
        name = getattr(func, "__name__", repr(func))
        if named:
            placed, origin = _is_rank_device(device), f"{name}(device={device!r}) at {_clause_line()}"
            if not placed and out is (args[0] if args else None) and getattr(out, _PLACED, False):
                out = out.clone()  # on a GPU this is a copy: the placed original stays placed
            self.tag(_tensors(out), placed, origin, retag=True)
            return out
        inputs = [t for t in _tensors((args, kwargs)) if hasattr(t, _PLACED)]
        if any(getattr(t, _PLACED) for t in inputs):
            self.tag(_tensors(out), True, "")
        elif inputs:
            self.tag(_tensors(out), False, getattr(inputs[0], _ORIGIN))
        elif not _tensors((args, kwargs)):  # a factory without device=: lands on the default device
            self.tag(_tensors(out), False, f"{name}() without device= at {_clause_line()}")
        return out

    @staticmethod
    def tag(tensors, placed, origin: str, retag: bool = False) -> None:
        if placed is None:
            return
        for t in tensors:
            if retag or not hasattr(t, _PLACED):
                setattr(t, _PLACED, placed)
                setattr(t, _ORIGIN, origin)

    def check(self, func, args, kwargs) -> None:
        stray = [t for t in _tensors((args, kwargs)) if getattr(t, _PLACED, True) is False]
        if not stray:
            return
        from fixtures.rank import ctx

        record = {"call": f"{func.__module__}.{func.__name__}", "rank": ctx.rank, "at": _clause_line(),
                  "tensor": getattr(stray[0], _ORIGIN, "")}
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")


def _install() -> None:
    """In a rank: the rank's device becomes FAKE_DEVICE once the harness has set it, and the audit starts."""
    from fixtures.rank import ctx, on_attach

    def fake_device() -> None:
        if ctx.device != FAKE_DEVICE:
            assert ctx.device == "cpu", f"device_audit runs on a CPU backend, the rank has {ctx.device}"
            ctx.device = FAKE_DEVICE
            audit = DeviceAudit(os.environ[LOG_ENV])
            audit.mode.__enter__()  # for the rest of this rank's life, in its main thread (clauses run there)

    on_attach(fake_device)


if os.environ.get(LOG_ENV):
    # Registered wherever the module is imported: a rank imports it when it joins a world (fresh zygote), or inherits
    # it from the controller that imported it for its spec (forked zygote); the controller never attaches.
    _install()
