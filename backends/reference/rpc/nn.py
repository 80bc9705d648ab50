"""torch.distributed.nn.RemoteModule over the reference agents, in plain Python.

``RemoteModule("worker1/cpu", nn.Linear, args=(20, 30))`` builds the module
on worker1 (non-blocking ``remote``: a failing constructor surfaces at first
use) and offers ``forward`` / ``forward_async`` (one ``rpc_async`` to the
owner running the module's forward: a Python UDF, so under a distributed
autograd context the gradients reach the remote parameters),
``remote_parameters()`` (RRefs owned by the module's worker, for
DistributedOptimizer) and ``get_module_rref()``. Everything else of
nn.Module that would act on a local copy refuses with torch's text.

``RemoteDevice`` parses the ``remote_device`` string as torch's
``torch.distributed._remote_device`` does, in torch's order and with its
texts (spec ../shared/specs/dist-autograd.md E1): ``"<workername>/<device>"``,
``"rank:<rank>/<device>"``, ``"<workername>"`` (device cpu) or a local
``"<device>"``; the device part goes through ``torch.device`` (its errors pass
through as RuntimeError). Parsing needs no GPU: ``"worker1/cuda:0"`` parses
on a CPU build and fails when the module is created.

Only the non-scriptable RemoteModule exists here (no ``_module_interface_cls``:
TorchScript RPC of a module interface is TensorPipe-only). ``is_device_map_set``
is torch's: whether the agent has a device map for the module's worker.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
from torch import nn

from . import api as rpc
from . import serialize
from .rref import RRef

__all__ = ["RemoteModule", "RemoteDevice"]


# ------------------------------------------------------------------ remote device
class RemoteDevice:
    """A device on a worker: ``worker_name()`` or ``rank()`` (one of them, or neither: local) and ``device()``."""

    def __init__(self, remote_device: str | torch.device):
        parse_error = (f"Could not parse remote_device: {remote_device}. The valid format is "
                       "'<workername>/<device>' or 'rank:<rank>/<device>' or '<device>'")
        self._worker_name: str | None = None
        self._rank: int | None = None
        if isinstance(remote_device, torch.device):
            device = remote_device
        elif isinstance(remote_device, str):
            fields = remote_device.split("/")
            if len(fields) == 2:
                self._worker_name, device = fields
            elif len(fields) == 1:
                if _is_valid_local_device(fields[0]):
                    device = fields[0]
                else:  # a single field that is not a device names a worker; the device defaults to cpu
                    self._worker_name, device = fields[0], "cpu"
            else:
                raise ValueError(parse_error)
        else:
            raise TypeError(f"Invalid type for remote_device: {type(remote_device)}")
        if self._worker_name is not None and not self._worker_name:
            raise ValueError(parse_error)
        self._device = torch.device(device)  # torch.device's own errors reach the caller unchanged
        if self._worker_name is not None:
            parts = self._worker_name.split(":")
            if len(parts) == 2:
                if parts[0] == "rank" and parts[1].isdigit():
                    self._rank, self._worker_name = int(parts[1]), None
                else:
                    raise ValueError(parse_error)
            elif len(parts) > 2:
                raise ValueError(parse_error)

    def worker_name(self) -> str | None:
        return self._worker_name

    def rank(self) -> int | None:
        return self._rank

    def device(self) -> torch.device:
        return self._device

    def __repr__(self) -> str:
        if self._worker_name is not None:
            return f"{self._worker_name}/{self._device}"
        if self._rank is not None:
            return f"rank:{self._rank}/{self._device}"
        return str(self._device)

    def __eq__(self, other) -> bool:
        return isinstance(other, RemoteDevice) and (self._worker_name, self._device, self._rank) == \
            (other._worker_name, other._device, other._rank)

    def __hash__(self) -> int:
        return hash((self._worker_name, self._device, self._rank))


def _is_valid_local_device(text: str) -> bool:
    try:
        torch.device(text)
        return True
    except Exception:
        return False


# ------------------------------------------------------------------ on the module's worker
def _create_module(module_cls, args, kwargs, device: str) -> nn.Module:
    module = module_cls(*args, **kwargs)
    if not isinstance(module, nn.Module):  # torch's text (remote_module.py _create_module)
        raise ValueError("Expect `module_cls(*args, **kwargs)` returns an instance of <class nn.Module>, "
                         f"but it returns an instance of {type(module)}.")
    module.to(device)
    return module


def _param_rrefs(module_rref: RRef, recurse: bool) -> list[RRef]:
    return [RRef(param) for param in module_rref.local_value().parameters(recurse)]


def _to_device(value, device: torch.device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value


def _remote_forward(module_rref: RRef, device: str, is_device_map_set: bool, *args, **kwargs):
    """The module's forward on its worker (torch's non-scriptable template)."""
    module = module_rref.local_value()
    target = torch.device(device)
    if target.type != "cuda":
        return module.forward(*args, **kwargs)
    # a module on a GPU: CPU inputs move to its device; without a device map only CPU tensors travel back
    args = tuple(_to_device(a, target) for a in args)
    kwargs = {k: _to_device(v, target) for k, v in kwargs.items()}
    out = module.forward(*args, **kwargs)
    return out if is_device_map_set else _to_cpu(out)


def _raise_not_supported(name: str) -> None:
    raise ValueError(f"Method ``{name}`` not supported for RemoteModule")


# What travels when a RemoteModule is an RPC argument (torch's _REMOTE_MODULE_PICKLED_ATTRIBUTES).
_PICKLED_ATTRIBUTES = ("on", "device", "is_device_map_set", "is_scriptable", "generated_methods", "module_rref")
# nn.Module's own state and the installed methods: deliberately not sent
_NOT_PICKLED = ("training", "_parameters", "_buffers", "_non_persistent_buffers_set", "_backward_hooks",
                "_backward_pre_hooks", "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs",
                "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
                "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                "_load_state_dict_post_hooks", "_modules", "forward_async", "forward")


# ------------------------------------------------------------------ the caller's handle
# Named as the methods they become (torch's generated template does the same): a bound method pickles
# as getattr(module, its function's __name__), so ``rm.forward`` (or ``vars(rm)``) travels over RPC.
def forward_async(self, *args, **kwargs) -> torch.futures.Future:
    return rpc.rpc_async(self.module_rref.owner(), _remote_forward,
                         (self.module_rref, self.device, self.is_device_map_set, *args), kwargs)


def forward(self, *args, **kwargs):
    return forward_async(self, *args, **kwargs).wait()


_GENERATED_METHODS = (forward_async, forward)


class RemoteModule(nn.Module):
    """A module living on another worker; ``forward`` runs there (torch.distributed.nn.RemoteModule).

    Args: ``remote_device`` "<workername>/<device>" or "rank:<rank>/<device>"
    (device optional, default cpu); ``module_cls`` and its ``args`` /
    ``kwargs``, called on that worker.
    """

    def __init__(self, remote_device: str, module_cls: type[nn.Module], args: tuple | None = None,
                 kwargs: dict[str, Any] | None = None):
        super().__init__()
        self._prepare_init(remote_device)
        self.is_scriptable = False
        self.generated_methods = _GENERATED_METHODS
        # non-blocking, as torch: a constructor that raises on the worker fails the first use
        self.module_rref = rpc.remote(self.on, _create_module,
                                      (module_cls, args if args is not None else (),
                                       kwargs if kwargs is not None else {}, self.device))
        self._install_generated_methods()

    def _prepare_init(self, remote_device: str) -> None:
        try:
            rpc._current_agent()
        except RuntimeError:
            raise AssertionError("RemoteModule only works in RPC.") from None  # torch's text and type
        parsed = RemoteDevice(remote_device)
        self.on = parsed.worker_name() if parsed.worker_name() is not None else parsed.rank()
        if self.on is None:
            # torch fails here too (a TypeError from get_worker_info(None)); ours names the problem
            raise TypeError(f"RemoteModule needs a remote device naming a worker ('<workername>/<device>' or "
                            f"'rank:<rank>/<device>'), not the local device {remote_device!r}")
        self.device = str(parsed.device())
        agent = rpc._current_agent()
        # an unknown worker or rank: the agent's lookup error, now; then torch's rule (remote_module.py _prepare_init)
        self.is_device_map_set = bool(agent._get_device_map(agent.worker_info(self.on)))

    def _install_generated_methods(self) -> None:
        for method in self.generated_methods:
            setattr(self, method.__name__, types.MethodType(method, self))

    @staticmethod
    def init_from_module_rref(remote_device: str, module_rref: RRef, _module_interface_cls: Any = None):
        """Another RemoteModule over the module ``module_rref`` points to (no new module is made)."""
        if _module_interface_cls is not None:
            raise NotImplementedError("the reference RemoteModule is not scriptable (no _module_interface_cls)")
        remote_module = object.__new__(RemoteModule)
        nn.Module.__init__(remote_module)
        remote_module._prepare_init(remote_device)
        remote_module.is_scriptable = False
        remote_module.generated_methods = _GENERATED_METHODS
        remote_module.module_rref = module_rref
        remote_module._install_generated_methods()
        return remote_module

    def remote_parameters(self, recurse: bool = True) -> list[RRef]:
        """RRefs (owned by the module's worker) to the module's parameters, e.g. for DistributedOptimizer."""
        return rpc.rpc_sync(self.on, _param_rrefs, args=(self.module_rref, recurse))

    def get_module_rref(self) -> RRef:
        return self.module_rref

    def train(self, mode: bool = True):
        return self.module_rref.rpc_sync().train(mode)

    def eval(self):
        return self.module_rref.rpc_sync().eval()

    # outside an RPC a RemoteModule does not pickle (torch's texts)
    def __getstate__(self):
        raise RuntimeError("Cannot pickle RemoteModule in python pickler. RemoteModule can only be pickled "
                           "when using RPC")

    def __setstate__(self, state):
        raise RuntimeError("Cannot unpickle RemoteModule in python pickler. RemoteModule can only be unpickled "
                           "when using RPC")

    def parameters(self, recurse: bool = True):
        raise ValueError("Method ``parameters`` not supported for RemoteModule. Please use ``remote_parameters`` "
                         "instead.")


def _unsupported(name: str):
    def method(self, *args, **kwargs):
        _raise_not_supported(name)
    method.__name__ = name
    return method


# torch's list (remote_module.py): methods that would act on a local copy refuse
for _name in ("register_buffer", "register_parameter", "add_module", "apply", "cuda", "ipu", "xpu", "cpu", "type",
              "float", "double", "half", "bfloat16", "to", "register_backward_hook", "register_forward_pre_hook",
              "register_forward_hook", "state_dict", "load_state_dict", "named_parameters", "buffers",
              "named_buffers", "children", "named_children", "modules", "named_modules", "requires_grad_",
              "zero_grad", "share_memory", "extra_repr"):
    setattr(RemoteModule, _name, _unsupported(_name))


# ------------------------------------------------------------------ over RPC
def _remote_module_receiver(*values) -> RemoteModule:
    module = object.__new__(RemoteModule)
    module.__dict__.update(zip(_PICKLED_ATTRIBUTES, values))
    module._install_generated_methods()
    return module


def _remote_module_reducer(module: RemoteModule):
    """Inside an RPC message: the six attributes torch sends; anything else is named on stderr and dropped."""
    for key in module.__dict__:
        if key not in _PICKLED_ATTRIBUTES and key not in _NOT_PICKLED:
            print(f"The new attribute ``{key}`` of RemoteModule is ignored during RPC pickling. "
                  "To pickle this attribute, please add it to ``_REMOTE_MODULE_PICKLED_ATTRIBUTES``. "
                  "Otherwise, please explicitly add it to ``_REMOTE_MODULE_ATTRIBUTES_IGNORE_FOR_PICKLING``.",
                  file=sys.stderr)
    return _remote_module_receiver, tuple(module.__dict__[key] for key in _PICKLED_ATTRIBUTES)


serialize.register_reducer(RemoteModule, _remote_module_reducer)
