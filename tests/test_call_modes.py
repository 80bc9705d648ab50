"""The table of RPC call modes (suites/rpc/call_modes.py): each record calls the function it names and waits
the way it says, the requirement vocabulary knows every mode, and torch's exec modes find their record."""

from __future__ import annotations

import pytest
import torch

from backends.spec import UnknownRequirementValue, check_requirement_keys
from suites.rpc import call_modes
from suites.rpc.call_modes import CALLS, FUNCTION_CALLS, REMOTE, RPC_ASYNC, RPC_SYNC, RREF_METHOD


class _RRef:
    def __init__(self, value):
        self.value = value

    def to_here(self, timeout=None):
        return self.value


class _Rpc:
    """torch.distributed.rpc's three calls, run here: records what each was asked."""

    def __init__(self):
        self.asked = []

    def _run(self, api, to, func, args, kwargs, timeout):
        self.asked.append((api, to, timeout))
        return func(*(args or ()), **(kwargs or {}))

    def rpc_sync(self, to, func, args=None, kwargs=None, timeout=None):
        return self._run("rpc_sync", to, func, args, kwargs, timeout)

    def rpc_async(self, to, func, args=None, kwargs=None, timeout=None):
        future = torch.futures.Future()
        future.set_result(self._run("rpc_async", to, func, args, kwargs, timeout))
        return future

    def remote(self, to, func, args=None, kwargs=None, timeout=None):
        return _RRef(self._run("remote", to, func, args, kwargs, timeout))


def _scaled(x, scale=1):
    return x * scale


@pytest.mark.parametrize("name", FUNCTION_CALLS)
def test_each_function_mode_calls_its_api_and_waits_for_the_value(name):
    rpc = _Rpc()
    assert CALLS[name].invoke(rpc, "worker1", _scaled, (3,), {"scale": 2}, timeout=5) == 6
    assert rpc.asked == [(CALLS[name].api, "worker1", 5)]


def test_the_returned_handle_is_what_the_mode_says():
    rpc = _Rpc()
    assert RPC_SYNC.call(rpc, "w", _scaled, (4,)) == 4 and RPC_SYNC.blocking
    assert isinstance(RPC_ASYNC.call(rpc, "w", _scaled, (4,)), torch.futures.Future) and not RPC_ASYNC.blocking
    assert isinstance(REMOTE.call(rpc, "w", _scaled, (4,)), _RRef) and REMOTE.wait_method == "to_here"
    assert RPC_ASYNC.wait_all([RPC_ASYNC.call(rpc, "w", _scaled, (i,)) for i in range(3)]) == [0, 1, 2]
    assert REMOTE.wait_all([REMOTE.call(rpc, "w", _scaled, (i,)) for i in range(3)]) == [0, 1, 2]


def test_the_rref_mode_calls_a_method_through_the_proxy():
    class Owned:
        def add(self, x):
            return x + 1

    class ProxiedRRef:
        def rpc_sync(self):
            return Owned()

    assert RREF_METHOD.invoke_method(ProxiedRRef(), "add", 41) == 42
    with pytest.raises(TypeError, match="use call_method"):
        RREF_METHOD.call(_Rpc(), "w", _scaled, (1,))


def test_every_mode_is_a_known_rpc_call_value_and_nothing_else_is():
    check_requirement_keys({"rpc_call": tuple(CALLS)}, "test")
    with pytest.raises(UnknownRequirementValue, match="unknown rpc_call 'sync'"):
        check_requirement_keys({"rpc_call": "sync"}, "test")


def test_torchs_exec_modes_name_the_function_modes():
    assert [call_modes.by_exec_mode(m) for m in ("sync", "async", "remote")] == [RPC_SYNC, RPC_ASYNC, REMOTE]
    assert [call_modes.exec_mode_of(n) for n in FUNCTION_CALLS] == ["sync", "async", "remote"]
    with pytest.raises(call_modes.UnknownCallMode, match="known: sync, async, remote"):
        call_modes.by_exec_mode("rref")
    with pytest.raises(call_modes.UnknownCallMode, match="known: rpc_sync, rpc_async, remote, rref_method"):
        call_modes.get("rpc")
