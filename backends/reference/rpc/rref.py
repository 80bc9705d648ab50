"""RRef: a reference to a value owned by one worker, as torch.distributed.rpc.RRef.

An RRef is a handle (rref id, fork id, owner); the bookkeeping lives in the
agent's owner table (owners.py ``OwnerTable``), which changes an RRef only
through its methods here. The reference counting rule, a simplified
form of torch's fork protocol that never frees a value still referenced:

* the owner keeps, per value, the set of live fork ids (every RRef object on
  any worker is one fork, the owner's own included);
* ``remote()`` creates the value with the caller's fork registered (done
  when the request is delivered, before any later message of that caller);
* pickling an RRef into a message makes a new fork id; a user sends
  RREF_FORK_REQUEST to the owner *before* the message (the owner registers
  it locally), so the sender's own fork, whose delete can only follow on the
  same ordered connection, keeps the count above zero until the new fork is
  registered;
* a fork whose delete reaches the owner before its registration leaves a
  tombstone that cancels the registration;
* when an RRef object is garbage collected its fork is deleted (a user sends
  RREF_USER_DELETE); the owner drops the value when no fork is left.

A message that never arrives leaks its forks (the value is kept): never the
other way round.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.distributed.rpc import functions

from . import calls, current, profiling, serialize

UNSET = calls.UNSET_RPC_TIMEOUT


def _gid(pair) -> str:
    return f"GloballyUniqueId(created_on={pair[0]}, local_id={pair[1]})"


class RRef:
    """A remote reference. ``RRef(value)`` makes a local one owned by this worker."""

    __slots__ = ("_agent", "rref_id", "fork_id", "_owner", "_is_owner", "_creation", "_confirmed", "_error",
                 "__weakref__")

    def __init__(self, value, type_hint=None):
        agent = current.agent()
        agent.rrefs.adopt_local(self, value)

    @classmethod
    def _make(cls, agent, rref_id, fork_id, owner: int, confirmed: bool, creation=None) -> "RRef":
        self = cls.__new__(cls)
        self._bind(agent, rref_id, fork_id, owner, confirmed, creation)
        return self

    def _bind(self, agent, rref_id, fork_id, owner: int, confirmed: bool, creation=None) -> None:
        self._agent = agent
        self.rref_id = rref_id
        self.fork_id = fork_id
        self._owner = owner
        self._is_owner = owner == agent.rank
        self._creation = creation
        self._confirmed = confirmed
        self._error: BaseException | None = None

    def _adopt(self, agent, rref_id, fork_id) -> None:
        """Become the owner RRef of a local value (``RRef(value)``: owners.py registers the value)."""
        self._bind(agent, rref_id, fork_id, agent.rank, confirmed=True)

    def _created_by(self, creation) -> None:
        """remote() returned this user RRef: ``creation`` is the future of the call that builds the value."""
        self._creation = creation

    # ----------------------------------------------------------- the agent's view
    def _owner_rank(self) -> int:
        return self._owner

    def _creation_error(self) -> BaseException | None:
        """The error of the remote() that was to create the value (None: none, or not yet known)."""
        return self._error

    def _creation_pending(self):
        """The creating remote()'s future while it runs, else None."""
        creation = self._creation
        return None if creation is None or creation.done() else creation

    def _creation_failed(self, error: BaseException) -> None:
        """The creating remote() failed or timed out: to_here raises ``error`` (the first one kept)."""
        if self._error is None:
            self._error = error

    def _confirm(self) -> None:
        """The owner answered the creating remote(): the value exists."""
        self._confirmed = True

    def _fork(self) -> tuple:
        """A new fork of this RRef for a message being pickled (registered with the owner first)."""
        if self._agent.stopped:
            raise RuntimeError(f"{self} belongs to an RPC agent that was shut down")
        return self._agent.rrefs.fork(self.rref_id, self._owner, self._is_owner, self.confirmed_by_owner())

    # ----------------------------------------------------------- queries
    def owner(self):
        return self._agent.workers[self._owner]

    def owner_name(self) -> str:
        return self._agent.workers[self._owner].name

    def is_owner(self) -> bool:
        return self._is_owner

    def confirmed_by_owner(self) -> bool:
        return self._is_owner or self._confirmed

    def local_value(self):
        if not self._is_owner:
            # torch's text (rref_impl.cpp UserRRef::localValue)
            raise RuntimeError(f"For UserRRef(rref_id={_gid(self.rref_id)}, fork_id={_gid(self.fork_id)}), "
                               f"can't call localValue() on user {self._agent.info}. "
                               f"Call it on owner {self.owner()}")
        return self._agent.rrefs.local_value(self.rref_id)

    def to_here(self, timeout: float = UNSET):
        """The value: a copy fetched from the owner (or the owner's own value)."""
        if self._is_owner:
            return self._agent.rrefs.local_value(self.rref_id)
        with profiling.to_here_scope(self._agent.name, self.owner_name()), profiling.unrecorded():
            return self._agent.fetch(self, timeout).wait()

    def _get_future(self):
        """The future of this RRef's creation (completed at once for anything but a remote() result)."""
        if self._creation is not None:
            return self._creation
        done = torch.futures.Future()
        done.set_result(True)
        return done

    def _get_type(self, timeout: float = UNSET, blocking: bool = True):
        if self._is_owner:
            rref_type = type(self.local_value())
            if blocking:
                return rref_type
            done = torch.futures.Future()
            done.set_result(rref_type)
            return done
        fut = calls.rpc_async(self._owner, _type_on_owner, args=(self,), timeout=timeout)
        return fut.wait() if blocking else fut

    # ----------------------------------------------------------- proxies
    def rpc_sync(self, timeout: float = UNSET):
        return _Proxy(self, calls.rpc_sync, timeout)

    def rpc_async(self, timeout: float = UNSET):
        return _Proxy(self, calls.rpc_async, timeout)

    def remote(self, timeout: float = UNSET):
        return _Proxy(self, calls.remote, timeout)

    def backward(self, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
        """Run (distributed) autograd from this RRef's value, as torch's RRef.backward."""
        from .autograd import service

        service.rref_backward(self, dist_autograd_ctx_id, retain_graph)

    # ----------------------------------------------------------- life
    def __reduce__(self):
        # torch's text (python_rpc_handler / py_rref.cpp) for pickling outside an RPC
        raise RuntimeError("Can not pickle rref in python pickler, rref can only be pickled when using RPC")

    def __del__(self):
        agent = getattr(self, "_agent", None)
        if agent is not None:
            agent.rrefs.release(self._owner, self.rref_id, self.fork_id)

    def __repr__(self) -> str:
        if self._is_owner:
            return f"OwnerRRef({_gid(self.rref_id)})"
        return f"UserRRef(RRefId = {_gid(self.rref_id)}, ForkId = {_gid(self.fork_id)})"

    __str__ = __repr__


def _reduce_rref(rref: RRef):
    """Pickling inside an RPC message: register a new fork with the owner, send its data."""
    return _rref_from_fork, rref._fork()


def _rref_from_fork(rref_id, fork_id, owner, confirmed):
    return current.agent().rrefs.from_fork(tuple(rref_id), tuple(fork_id), owner, confirmed)


serialize.register_rref_class(RRef, _reduce_rref)


# ------------------------------------------------------------- proxies
class _Proxy:
    """``rref.rpc_sync().method(*args)``: runs ``method`` on the owner's value."""

    def __init__(self, rref: RRef, rpc_api, timeout: float):
        self._rref, self._api, self._timeout = rref, rpc_api, timeout

    def __getattr__(self, func_name: str):
        return partial(_invoke_on_owner, self._rref, self._api, func_name, self._timeout)


def _invoke_on_owner(rref, rpc_api, func_name, timeout, *args, **kwargs):
    if rpc_api is calls.remote:
        # torch (rref_proxy._invoke_rpc) asks the owner for the value's type first: a
        # missing method raises AttributeError here, not in a creation that fails later
        _check_method(rref._get_type(timeout=timeout), func_name)
    return rpc_api(rref._owner, _run_method, args=(rref, func_name, args, kwargs), timeout=timeout)


def _check_method(rref_type: type, func_name: str) -> None:
    """torch's lookup on the type (ScriptModules bypass it): AttributeError when it has no such attribute."""
    if not issubclass(rref_type, (torch.jit.ScriptModule, torch._C.ScriptModule)):
        getattr(rref_type, func_name)


@functions.async_execution
def _run_method(rref, func_name, args, kwargs):
    """On the owner: one call, whether the method is an @async_execution one (its Future) or not.

    torch first asks the owner for the value's type (one more round trip);
    looking at the method where it runs gives the same answer in one (for
    remote() the type is still asked first, see _invoke_on_owner).
    """
    method = getattr(rref.local_value(), func_name)
    if hasattr(method, "_wrapped_async_rpc_function"):
        return method(*args, **kwargs)
    done = torch.futures.Future()
    done.set_result(method(*args, **kwargs))
    return done


def confirm_with_owner(rref: RRef) -> torch.futures.Future:
    """A user received ``rref`` forked by another user: ask its owner to confirm the fork (torch's ACK).

    Completes (and the RRef reports ``confirmed_by_owner()``) once the owner
    registered the fork, i.e. its parent's fork request arrived there.
    """
    fut = calls.rpc_async(rref._owner, _fork_registered_on_owner, args=(rref.rref_id, rref.fork_id))

    def confirmed(done):
        done.wait()  # the owner's error, if any, is the caller's
        rref._confirm()
        return True

    return fut.then(confirmed)


@functions.async_execution
def _fork_registered_on_owner(rref_id, fork_id):
    return current.agent().rrefs.fork_registered(tuple(rref_id), tuple(fork_id))


def _type_on_owner(rref):
    return type(rref.local_value())
