"""The callee's side of a builtin call: the aten operator a qualified name names, run as torch runs it.

A caller sends a torch builtin (``torch.cos``, ``math.cos``, ``torch.add``)
as its qualified name (``torch.jit._builtins._find_builtin``: "aten::cos"),
and torch's callee runs the JIT operator of that name, its overload chosen by
schema against the arguments (a ScriptCall). Several callables share one
name in ``torch.jit._builtins._builtin_ops`` (math.cos, cmath.cos and
torch.cos are all "aten::cos"; math comes first in 34 names), so a name must
resolve to the operator, never to one of those callables: ``torch.cos`` of a
one-element tensor then returns a tensor and ``math.cos`` of a float a float,
on both sides of the wire. A name the table lists without an operator
(``torch.is_tensor``, ``torch.Tensor``, ``torch.get_num_threads``: 295 on torch
2.13) never leaves torch's caller, which matches the schema before sending:
the caller raises torch's RuntimeError (``NO_SCHEMA``), as it does for
arguments no schema of the name accepts (``check_arguments``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_OPERATORS: dict[str, Callable] = {}  # qualified name -> its operator, looked up once per process
_OPERATOR_IDS: set[int] = set()  # id() of every operator in _OPERATORS (they live as long as the process)
# torch's caller's text (matchBuiltinOp) for a builtin no schema of its name accepts; none exists here
NO_SCHEMA = "Overloaded torch operator invoked from Python failed to match any schema:\n"


def check_arguments(name: str, args: tuple, kwargs: dict) -> None:
    """On the caller: RuntimeError (torch's text) when no schema of ``name`` accepts these arguments.

    torch's caller matches a builtin's arguments against its schemas before
    sending (so ``torch.ones`` of the int 3, fine in Python, is refused: the
    operator takes a size list) and raises this text, without the details.
    """
    try:
        torch._C._jit_resolve_packet(name, *args, **kwargs)
    except RuntimeError:
        raise RuntimeError(NO_SCHEMA) from None


def check_sendable(name: str) -> None:
    """On the caller: RuntimeError (torch's text) when ``name`` has no operator, as torch refuses before sending."""
    if name not in _OPERATORS and torch._C._jit_get_operation(name)[0] is None:
        raise RuntimeError(NO_SCHEMA)


def resolve(name: str) -> Callable:
    """The operator ``name`` ("aten::cos") names, dispatching on its arguments' types; RuntimeError when none."""
    operator = _OPERATORS.get(name)
    if operator is None:
        operator = torch._C._jit_get_operation(name)[0] if isinstance(name, str) else None
        if operator is None:
            raise RuntimeError(f"Unknown builtin operator {name} on the callee")
        _OPERATORS[name] = operator
        _OPERATOR_IDS.add(id(operator))
    return operator


def is_operator(func) -> bool:
    """Whether ``func`` is an operator ``resolve`` returned: a builtin, whose failure is the request's error
    (torch runs builtins outside internal._run_function, so no profiler events travel with it)."""
    return id(func) in _OPERATOR_IDS
