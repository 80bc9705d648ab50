"""One table of RPC call modes: how a caller makes an RPC and how it waits for the value.

torch.distributed.rpc calls a function on a worker three ways, and an RRef's
proxies call a method of the RRef's value the same three ways
(``rref.rpc_sync().method(...)``). A ``CallMode`` record says, for one way:

* ``name``: the value of the requirement key ``rpc_call`` (backends/spec.py:
  an agent's gap names the modes it fails in) and the case id of the clauses
  that sweep the modes;
* ``api``: the function that makes the call, the same name on the rpc module
  (``rpc.rpc_async(to, func, args=...)``) and on an RRef
  (``rref.rpc_async().method(...)``); ``through_rref``: the mode calls a
  method of an RRef's value through that proxy;
* ``wait_method``: how the caller gets the value from what the call returned:
  nothing to do (None, the call blocks and returns it), the Future's
  ``wait`` or the RRef's ``to_here``;
* ``exec_mode``: torch's RPCExecMode value, which names the profiler's event
  ``rpc_<exec_mode>#<function>(<src> -> <dst>)``; the profiling clauses and the
  RPC benchmark show a mode by it (``sync``, ``async``, ``remote``).

Clauses take the mode as the parameter ``rpc_call`` (its name, so the case
states the requirement and only a string crosses to the ranks) and the rank
side looks the record up: ``CALLS[rpc_call].invoke(rpc, to, func, args)``.
Readers: suites/rpc (test_calls, test_timeouts, test_errors,
test_async_execution, test_device_maps), suites/profiling/workloads.py and its
clauses, suites/stress/rpc_bench.py and rpc_options.py (the benchmark's modes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends import spec as requirements


@dataclass(frozen=True, kw_only=True)
class CallMode:
    """One way of making an RPC, as data (see the module docstring)."""

    name: str
    api: str
    wait_method: str | None
    exec_mode: str
    through_rref: bool = False

    @property
    def blocking(self) -> bool:
        """The call itself returns the value (rpc_sync): there is nothing to wait for."""
        return self.wait_method is None

    def call(self, rpc, to, func, args: tuple = (), kwargs: dict | None = None, **timeout) -> Any:
        """Call ``func`` on worker ``to`` through ``rpc`` (torch.distributed.rpc or an agent's like module) this way;
        what it returns goes to ``wait``. ``timeout=`` is the call's own."""
        if self.through_rref:
            raise TypeError(f"RPC call mode {self.name} calls a method through an RRef: use call_method")
        return getattr(rpc, self.api)(to, func, args=args, kwargs=kwargs, **timeout)

    def call_method(self, rref, method: str, *args, **kwargs) -> Any:
        """Call ``method`` of ``rref``'s value through its ``api`` proxy (``rref.rpc_sync().method(...)``)."""
        return getattr(getattr(rref, self.api)(), method)(*args, **kwargs)

    def wait(self, returned: Any) -> Any:
        """The value of a call from what ``call`` (or ``call_method``) returned."""
        return returned if self.wait_method is None else getattr(returned, self.wait_method)()

    def wait_all(self, returned: list) -> list:
        """The values of many calls at once; futures through torch.futures.wait_all (torch's own stress test)."""
        if self.wait_method == "wait":
            import torch

            return torch.futures.wait_all(returned)
        return [self.wait(r) for r in returned]

    def invoke(self, rpc, to, func, args: tuple = (), kwargs: dict | None = None, **timeout) -> Any:
        """Call and wait: the plain value of ``func(*args, **kwargs)`` run on ``to``."""
        return self.wait(self.call(rpc, to, func, args, kwargs, **timeout))

    def invoke_method(self, rref, method: str, *args, **kwargs) -> Any:
        """Call ``method`` of ``rref``'s value this way and wait: its plain result."""
        return self.wait(self.call_method(rref, method, *args, **kwargs))


RPC_SYNC = CallMode(name="rpc_sync", api="rpc_sync", wait_method=None, exec_mode="sync")
RPC_ASYNC = CallMode(name="rpc_async", api="rpc_async", wait_method="wait", exec_mode="async")
REMOTE = CallMode(name="remote", api="remote", wait_method="to_here", exec_mode="remote")
# a method of an RRef's value through rref.rpc_sync() (torch runs it on the owner with an rpc_sync of its own)
RREF_METHOD = CallMode(name="rref_method", api="rpc_sync", wait_method=None, exec_mode="sync", through_rref=True)

CALLS: dict[str, CallMode] = {m.name: m for m in (RPC_SYNC, RPC_ASYNC, REMOTE, RREF_METHOD)}
# the ways of calling a function on a worker by name (the modes clauses sweep with any function)
FUNCTION_CALLS: tuple[str, ...] = tuple(name for name, mode in CALLS.items() if not mode.through_rref)

# The requirement vocabulary knows every mode of this table (backends/spec.py cannot import it).
requirements.add_value_source("rpc_call", lambda: CALLS)


class UnknownCallMode(ValueError):
    pass


def get(name: str) -> CallMode:
    try:
        return CALLS[name]
    except KeyError:
        raise UnknownCallMode(f"unknown RPC call mode {name!r}; known: {', '.join(CALLS)}") from None


def by_exec_mode(exec_mode: str) -> CallMode:
    """The function-calling mode torch's profiler (and the RPC benchmark) names ``exec_mode`` (sync, async, remote)."""
    for mode in CALLS.values():
        if mode.exec_mode == exec_mode and not mode.through_rref:
            return mode
    known = ", ".join(CALLS[n].exec_mode for n in FUNCTION_CALLS)
    raise UnknownCallMode(f"unknown RPC exec mode {exec_mode!r}; known: {known}")


def exec_mode_of(name: str) -> str:
    """The exec mode (sync, async, remote) of mode ``name``: the case id of the profiling clauses (pytest ids=)."""
    return get(name).exec_mode
