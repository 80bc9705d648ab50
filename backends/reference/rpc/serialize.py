"""Message headers: a pickle (protocol 5) with the tensors taken out.

``dumps(obj)`` returns ``(header_bytes, tensors)``: every tensor inside
``obj`` is replaced in the pickle by its index in ``tensors`` (as torch's
``_InternalRPCPickler`` does), so the transport can move tensor storage as
raw bytes and never pickles a tensor. ``loads(header, tensors)`` puts them
back. Inside ``placing(place)`` (the agent's scope for one message, with
device_maps.py's ``placement`` for its destination) a tensor on a device goes
into ``tensors`` as a host copy made by the device's own copy, and the
pickle says on which device the receiver puts it; outside one, and for a
tensor ``place`` refuses, only CPU tensors travel. RRefs inside ``obj`` travel as fork data (rref.py decides what a fork
means); ``dumps`` reports every RRef it pickled so the agent can register the
forks with their owners.

Only the agent unpickles, and only frames from peers that presented the
world's token (the transport checks it): a pickle is code, so the token is
what keeps strangers out.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import threading
from collections.abc import Callable

import torch

PROTOCOL = 5

# Per-thread tables, saved and restored around nested calls (a reducer that
# itself pickles) exactly as torch's _InternalRPCPickler does.
_tables = threading.local()


def _tensor_receiver(index: int):
    return _tables.recv[index]


def _grad_tensor_receiver(index: int):
    return _tables.recv[index].requires_grad_()


def _placed_tensor_receiver(index: int, device: str):
    """A tensor the sender's device map sends to ``device``: its host copy, copied onto that device."""
    return _tables.recv[index].to(device)


def _placed_grad_tensor_receiver(index: int, device: str):
    return _tables.recv[index].to(device).requires_grad_()


def _cpu_only(tensor: torch.Tensor) -> None:
    """Where no device map applies (outside ``placing``): a device tensor is refused, naming its device."""
    if tensor.device.type != "cpu":
        raise RuntimeError(f"RPC sends only CPU tensors here: found a tensor on device {tensor.device}, and this "
                           "message has no device map; move it to the CPU first")


def _tensor_reducer(tensor: torch.Tensor):
    if tensor.layout != torch.strided:
        raise TypeError(f"RPC sends strided (dense) tensors only, not {tensor.layout}")
    place = getattr(_tables, "place", None)
    if place is None:  # raises for a tensor that may not travel
        _cpu_only(tensor)
        target = None
    else:
        target = place(tensor)
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()  # the device's own copy: the transport reads host memory only
    send = _tables.send
    send.append(data)
    index = len(send) - 1
    if tensor.requires_grad:
        graded = getattr(_tables, "graded", None)
        if graded is not None:  # dumps_graded: distributed autograd records what was sent
            graded.append((index, tensor))
        if target is not None:
            return _placed_grad_tensor_receiver, (index, str(target))
        return _grad_tensor_receiver, (index,)
    if target is not None:
        return _placed_tensor_receiver, (index, str(target))
    return _tensor_receiver, (index,)


_rref_reducer = None  # set by rref.py (import order: rref imports serialize)


def _rref_reduce(rref):
    return _rref_reducer(rref)


_DISPATCH = copyreg.dispatch_table.copy()
# torch.Tensor exactly, as torch's _InternalRPCPickler: an nn.Parameter keeps its own __reduce_ex__, so it
# arrives as a Parameter (requires_grad kept, a leaf) around its ``.data``, which travels as a tensor that
# requires no grad: distributed autograd records no send for a Parameter itself, on torch as here.
_DISPATCH[torch.Tensor] = _tensor_reducer


def register_rref_class(cls, reducer) -> None:
    global _rref_reducer
    _rref_reducer = reducer
    _DISPATCH[cls] = _rref_reduce


def register_reducer(cls, reducer) -> None:
    """Pickle ``cls`` with ``reducer`` inside RPC messages only (torch's _InternalRPCPickler._register_reducer).

    Outside an RPC, ``cls`` keeps its own pickling (RemoteModule refuses it).
    """
    _DISPATCH[cls] = reducer


class _Pickler(pickle.Pickler):
    dispatch_table = _DISPATCH


class _Reusable(threading.local):
    """A pickler per thread, reused: making one costs more than pickling a small header."""

    def __init__(self):
        self.buffer = io.BytesIO()
        self.pickler = _Pickler(self.buffer, PROTOCOL)
        self.busy = False


_reusable = _Reusable()


class placing:
    """Within: every tensor dumped asks ``place`` where it lands (a device, None for the CPU; it raises to refuse);
    ``place`` None: CPU tensors only. A class, not a generator: it wraps every message the agent sends."""

    __slots__ = ("place", "outer")

    def __init__(self, place: Callable[[torch.Tensor], torch.device | None] | None) -> None:
        self.place = place

    def __enter__(self) -> None:
        self.outer = getattr(_tables, "place", None)
        _tables.place = self.place

    def __exit__(self, *exc) -> None:
        _tables.place = self.outer


def dumps(obj) -> tuple[bytes, list]:
    """(pickle bytes, tensors taken out of it) for ``obj``."""
    outer = getattr(_tables, "send", None)
    tensors: list = []
    _tables.send = tensors
    mine = _reusable
    try:
        if mine.busy:  # nested (a reducer that sends a message): a fresh pickler
            buffer = io.BytesIO()
            _Pickler(buffer, PROTOCOL).dump(obj)
            return buffer.getvalue(), tensors
        mine.busy = True
        buffer = mine.buffer
        buffer.seek(0)
        buffer.truncate()
        mine.pickler.clear_memo()
        try:
            mine.pickler.dump(obj)
        finally:
            mine.pickler.clear_memo()  # the memo holds what was pickled: RRefs must be free to die
            mine.busy = False
        return buffer.getvalue(), tensors
    finally:
        _tables.send = outer


def dumps_graded(obj) -> tuple[bytes, list, list]:
    """``dumps`` plus (index, original tensor) of every tensor requiring grad, in order (the send function's inputs)."""
    outer = getattr(_tables, "graded", None)
    graded: list[tuple[int, object]] = []  # (index, tensor)
    _tables.graded = graded
    try:
        header, tensors = dumps(obj)
    finally:
        _tables.graded = outer
    return header, tensors, graded


def loads(data, tensors: list):
    """The object ``dumps`` produced, with ``tensors`` put back in their places."""
    if not tensors:
        return pickle.loads(data)
    outer = getattr(_tables, "recv", None)
    _tables.recv = tensors
    try:
        return pickle.loads(data)
    finally:
        _tables.recv = outer


def self_copy(tensors: list) -> list:
    """What a self-call receives: copies, as if the tensors had crossed a wire."""
    return [t.clone() for t in tensors]
