"""Contract: what arrives is what torch's TensorPipe agent delivers: the operator, the class, the layout, the text.

A torch builtin (``torch.cos``, ``torch.pow``, ...) runs on the callee as the
aten operator its name names, matched by schema as TorchScript matches it:
``torch.cos`` of a tensor returns a tensor (of one element too), ``math.cos``
of a float returns a float (both are ``aten::cos``); a builtin no operator
implements (``torch.is_tensor``), or arguments no schema takes
(``torch.ones(3)``: the operator wants a size list), raise torch's
RuntimeError on the caller, which matches the schema before sending. An
``nn.Parameter`` arrives as an ``nn.Parameter`` (requires_grad kept, a leaf),
also inside a returned module. A tensor whose memory is not row-major (a
transpose, a permute, channels_last, an expand) arrives with the strides it
was sent with, as argument and as return value (torch sends the tensor's
storage with its strides). A re-raised remote error's text is decoded as
torch's ``internal._handle_exception`` decodes it (``unicode_escape``): the
repr of a message with a line break shows a real line break. All measured on
torch 2.13, TensorPipe.
"""

from __future__ import annotations

import cmath
import math

import torch

from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.rpc import udfs
from suites.rpc.common import outcome_of, peer_name


def builtin_calls() -> dict[str, tuple]:
    """name -> (builtin, args): builtins whose aten name math/cmath share, on tensors of 3, 1 and 0 dims."""
    one = torch.tensor([0.5])
    return {
        "torch.cos(3 elements)": (torch.cos, (torch.linspace(0, 1, 3),)),
        "torch.cos(1 element)": (torch.cos, (one,)),
        "torch.exp(0-d)": (torch.exp, (torch.tensor(0.25),)),
        "torch.sqrt": (torch.sqrt, (torch.tensor([4.0]),)),
        "torch.log": (torch.log, (torch.tensor([2.0]),)),
        "torch.tanh": (torch.tanh, (one,)),
        "torch.pow": (torch.pow, (torch.tensor([2.0]), 3)),
        "torch.floor": (torch.floor, (torch.tensor([1.5]),)),
        "torch.isnan": (torch.isnan, (torch.tensor([float("nan")]),)),
        "torch.angle": (torch.angle, (torch.tensor([-1.0]),)),
        "torch.polar": (torch.polar, (torch.tensor([2.0]), torch.tensor([0.0]))),
        "torch.atan2": (torch.atan2, (torch.tensor([1.0]), torch.tensor([1.0]))),
        "math.cos": (math.cos, (0.5,)),
        "cmath.exp": (cmath.exp, (1j,)),
    }


# refused on torch's caller, which matches the schema before sending: builtins torch's table names but no
# operator implements, and arguments Python takes but no schema does (aten::ones wants a size list)
REFUSED_BUILTINS = {"torch.is_tensor": (torch.is_tensor, (torch.ones(1),)),
                    "torch.get_num_threads": (torch.get_num_threads, ()),
                    "torch.ones(3)": (torch.ones, (3,))}
NO_SCHEMA = "Overloaded torch operator invoked from Python failed to match any schema:"


# ---------------------------------------------------------------- rank side
def call_builtins() -> dict:
    rpc = lifecycle.rpc()
    return {name: outcome_of(rpc.rpc_sync, peer_name(), fn, args=args)
            for name, (fn, args) in {**builtin_calls(), **REFUSED_BUILTINS}.items()}


def parameters_over_rpc():
    rpc = lifecycle.rpc()
    linear = rpc.rpc_sync(peer_name(), udfs.make_linear, args=(ctx.rank,))
    sent = {"requires_grad": torch.nn.Parameter(torch.ones(2)),
            "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False)}
    received = {name: rpc.rpc_sync(peer_name(), udfs.parameter_facts, args=(p,)) for name, p in sent.items()}
    returned = {name: udfs.parameter_facts(p) for name, p in linear.named_parameters()}
    return returned, received


def multiline_error():
    return outcome_of(lifecycle.rpc().rpc_sync, peer_name(), udfs.raise_expected, args=("line1\nline2", "ValueError"))


def strides_over_rpc():
    rpc = lifecycle.rpc()
    samples = udfs.layout_samples(ctx.rank)
    arrived = rpc.rpc_sync(peer_name(), udfs.strides_of, args=(list(samples.values()),))
    returned = rpc.rpc_sync(peer_name(), udfs.layouts, args=(ctx.rank,))
    return (dict(zip(samples, arrived)),
            {name: (tuple(t.stride()), t) for name, t in returned.items()})


# ---------------------------------------------------------------- clauses
def test_builtins_run_the_torch_operator(rpc_agent):
    """A torch builtin runs as its aten operator: torch.cos of a one-element tensor returns a tensor, math.cos a float."""
    calls = builtin_calls()
    for rank, outcomes in enumerate(rpc_agent.run(call_builtins)):
        for name in REFUSED_BUILTINS:
            got = outcomes.pop(name)
            assert got.error_type == "RuntimeError" and got.error.startswith(NO_SCHEMA), \
                f"rank {rank}: {name} (no aten operator) {got.describe()}; torch's caller raises RuntimeError " \
                f"{NO_SCHEMA!r}"
        for name, got in outcomes.items():
            fn, args = calls[name]
            want = fn(*args)
            assert not got.raised, f"rank {rank}: {name} {got.describe()}; torch returns {want!r}"
            assert type(got.value) is type(want), \
                f"rank {rank}: {name} returned a {type(got.value).__name__} ({got.value!r}), torch a " \
                f"{type(want).__name__} ({want!r})"
            if isinstance(want, torch.Tensor):
                assert got.value.dtype == want.dtype and got.value.shape == want.shape \
                    and torch.equal(got.value, want), f"rank {rank}: {name} returned {got.value!r}, expected {want!r}"
            else:
                assert got.value == want, f"rank {rank}: {name} returned {got.value!r}, expected {want!r}"


def test_parameter_keeps_its_class(rpc_agent):
    """An nn.Parameter arrives as an nn.Parameter (requires_grad kept, a leaf), sent or inside a returned module."""
    for rank, (returned, received) in enumerate(rpc_agent.run(parameters_over_rpc)):
        assert returned == {"weight": ("Parameter", True, True), "bias": ("Parameter", True, True)}, \
            f"rank {rank}: a returned nn.Linear's parameters arrived as (class, requires_grad, is_leaf) {returned}"
        assert received == {"requires_grad": ("Parameter", True, True), "frozen": ("Parameter", False, True)}, \
            f"rank {rank}: the callee received parameters as (class, requires_grad, is_leaf) {received}"


def test_strides_survive_rpc(rpc_agent):
    """A transposed, permuted, channels_last or expanded tensor arrives with its strides, as argument and as result."""
    want = {name: tuple(t.stride()) for name, t in udfs.layout_samples(0).items()}
    for rank, (arrived, returned) in enumerate(rpc_agent.run(strides_over_rpc)):
        assert arrived == want, f"rank {rank}: the callee received strides {arrived}, the caller sent {want}"
        for name, (strides, tensor) in returned.items():
            assert strides == want[name], f"rank {rank}: returned {name} has strides {strides}, sent {want[name]}"
            assert torch.equal(tensor, udfs.layout_samples(rank)[name]), f"rank {rank}: returned {name} is {tensor}"


def test_remote_error_text_is_decoded_as_torch_decodes_it(rpc_agent):
    """A re-raised remote error's text is unicode_escape-decoded as torch does: repr's \\n is a line break."""
    for rank, got in enumerate(rpc_agent.run(multiline_error)):
        assert got.error_type == "ValueError", f"rank {rank}: {got.describe()}"
        assert "\nValueError('line1\nline2')\n" in got.error, \
            f"rank {rank}: torch's caller reads the remote repr with a real line break, this one {got.error!r}"
