"""Remote profiling for the reference agents: torch 2.13's RPC profiling, in Python.

When the caller's legacy profiler is on (torch's gate:
``rpc.api._get_should_profile``: enabled and of LEGACY type), an RPC is
recorded under ``rpc_{sync|async|remote}#{name}({src} -> {dst})`` until its
future completes, and the request travels in a profiling envelope (the
profiler config and a profiling id). The callee runs the request with the
legacy profiler on, collects the events once the response is complete (so
``@async_execution`` work is included) and answers with them; the caller
renames each to ``key + "#remote_op: " + name``, keeps its node id (the
callee's rank), marks it remote and makes it part of what the user's profile
returns (profiling_hook.py explains how). When the request fails the exception
travels and no events do; a Python function that raises has not failed the
request (torch's RemoteException value): the agent answers with its error and
its events. Under the Kineto profiler nothing is wrapped. With no profiler
on, ``begin_call`` returns None after one check and nothing else runs.

These seams are called by the API (api.py, calls.py, rref.py) and, for the
agent core, by the profiling envelope layer (profiling_envelope.py)::

    set_node_id(rank)                                              # at init_rpc
    call = begin_call(mode, func, src_name, dst_name)              # None: not profiled
    fields["profiling"] = request_fields(call)                     # only if call is not None
    user_future = wrap_future(call, raw_future)                    # what rpc_async/remote hand out
    absorb_response(call, envelope_or_None)                        # response arrived, before raw_future completes
    fut = run_profiled(fields, run)   # callee; run() -> Future; fut -> (result, envelope)
    with to_here_scope(self_name, owner_name): ...                 # UserRRef.to_here
    with unrecorded(): ...    # the agent's own work on a user's thread: pickling, self-call
                              # copies, transport sends (calls.invoke around agent.call,
                              # to_here around agent.fetch, Agent._send for RRef messages)

Three things torch does in C++ with thread-local state that Python cannot
reach are done with sessions of extra records (profiling_records.py):

* the caller's C++ profiler cannot be handed events: a ``Session`` per
  profiling thread collects them and profiling_hook merges them;
* a callee must consolidate its thread's profiler before that thread serves
  other requests, so work that finishes later (the end of a nested RPC, a
  callback on another thread) is recorded into the callee's session instead:
  nested RPC ranges as synthetic push/pop records, callbacks under a
  short-lived profiler of their own on the completing thread (``capture``);
* torch runs future callbacks under the caller's profiler state
  (wrapPropagateTLSState); the future handed to the user is completed inside
  ``capture`` for the same effect.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings

import torch
from torch.autograd import ProfilerConfig, ProfilerState

from . import profiling_hook, profiling_records

REMOTE_OP = "#remote_op: "  # torch's REMOTE_PROFILING_KEY_PREFIX
KINETO_WARNING = "Profiling a distributed call with the Kineto profiler will profile the caller, but not the worker."

_tls = threading.local()  # .session: the Session that RPCs and callbacks on this thread belong to
_ids = itertools.count(1)
_node = {"id": -1}  # this process's profiler node id (torch: -1 until init_rpc sets the rank)
_warned_kineto: list[bool] = []
# How long ending a profile waits for callbacks still running under a capture
# (a callback that blocks longer loses its events rather than hanging the user).
CAPTURE_WAIT_S = 10.0
UNKNOWN_NODE = -2  # placeholder in synthetic records (torch's own ids are >= -1)


class ProfilingError(RuntimeError):
    """A profiling envelope that does not belong to the call it came back for."""


# ------------------------------------------------------------------ pieces
def set_node_id(rank: int) -> None:
    """For init_rpc: the profiler tags every event of this process with ``rank``, as torch does.

    (The agent core may call torch's _set_profiler_node_id itself: sessions
    read the node id back from the records torch stamps.)"""
    torch._C._distributed_rpc._set_profiler_node_id(int(rank))
    _node["id"] = int(rank)


def node_id() -> int:
    return _node["id"]


def next_profiling_id() -> int:
    # torch: worker id << 48 | local counter (RemoteProfilerManager::getNextProfilerId)
    return (max(node_id(), 0) << 48) | next(_ids)


def function_name(func) -> str:
    """The name torch puts in the key: builtin qualified name, TorchScript qualified name, else __qualname__."""
    if isinstance(func, str):
        return func
    builtin = torch.jit._builtins._find_builtin(func)
    if builtin is not None:
        return builtin
    if isinstance(func, torch.jit.ScriptFunction):
        return torch._jit_internal._qualified_name(func)
    # torch reads func.__qualname__ and fails on a callable object; name its type instead
    return getattr(func, "__qualname__", None) or type(func).__qualname__


def rpc_profiling_key(mode, func_name: str, src_name: str, dst_name: str) -> str:
    """torch.distributed.rpc.internal._build_rpc_profiling_key (mode: "sync" or an RPCExecMode)."""
    return f"rpc_{getattr(mode, 'value', mode)}#{func_name}({src_name} -> {dst_name})"


def remote_record(record: dict, prefix: str) -> dict:
    """A callee's record as the caller keeps it: renamed under the RPC's key, node id kept, remote."""
    return dict(record, name=prefix + record["name"], remote=True)


def callee_config(fields: dict) -> tuple[bool, bool]:
    """(record_shapes, profile_memory) the callee profiles with: the caller's."""
    return bool(fields["record_shapes"]), bool(fields["profile_memory"])


def legacy_profiling_on() -> bool:
    return (torch.autograd._profiler_enabled()
            and torch._C._autograd._profiler_type() == torch._C._profiler.ActiveProfilerType.LEGACY)


# ----------------------------------------------------------------- sessions
class Session:
    """Records one profiler gets besides its own C++ ones, and the config remote work runs with.

    ``callee``: the session of one profiled request on its callee; its C++
    profiler is consolidated when ``run()`` returns, so later ranges are
    synthetic. Otherwise the session extends the user's profile running on
    ``thread``.
    """

    def __init__(self, record_shapes: bool, profile_memory: bool, *, callee: bool = False):
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.callee = callee
        self.thread = threading.get_ident()
        self._cond = threading.Condition()
        self._lists: list[list[dict]] = []
        self._legacy_thread: dict[int, int] = {}  # Python thread ident -> the profiler's thread id
        self._node_id = None  # the node id torch stamped on this session's own records
        self._pending = 0  # captures in progress
        self._when_idle: list = []
        self._closed = False

    def config(self) -> ProfilerConfig:
        # torch's envelope carries [state, report_input_shapes, profile_memory]; the rest stays off
        return ProfilerConfig(ProfilerState.CPU, self.record_shapes, self.profile_memory, False, False, False,
                              torch._C._profiler._ExperimentalConfig())

    def owns_cpp_profiler(self) -> bool:
        """True in the user's profiling thread: torch's own record_function can time the RPC there."""
        return not self.callee and self.thread == threading.get_ident()

    def add(self, record_lists: list[list[dict]]) -> None:
        with self._cond:
            if not self._closed:  # events arriving after the profile ended are lost, as in torch
                self._lists.extend(lst for lst in record_lists if lst)

    def add_legacy(self, thread_records, ident: int) -> None:
        lists = profiling_records.from_legacy_lists(thread_records)
        for records in lists:
            for r in records:
                if r["name"] == profiling_records.START_MARK:
                    with self._cond:
                        self._legacy_thread.setdefault(ident, r["thread"])
                        self._node_id = r["node_id"]
        self.add(lists)

    def add_range(self, name: str, start_us: float, end_us: float, ident: int, handle: int) -> None:
        # thread and node id are filled in by close(), from the session's own records
        rng = profiling_records.synthetic_range(name, node_id=UNKNOWN_NODE, thread=-ident, start_us=start_us,
                                                end_us=end_us, handle=handle)
        self.add([rng])

    @contextlib.contextmanager
    def capture(self):
        """Record what runs in this block (callbacks of a completing future) into this session."""
        prev = getattr(_tls, "session", None)
        _tls.session = self
        with self._cond:
            own = not self._closed and not torch.autograd._profiler_enabled()
            if own:
                self._pending += 1
        if not own:  # this thread already profiles (e.g. completion inline in the user's thread)
            try:
                yield
            finally:
                _tls.session = prev
            return
        torch.autograd._enable_profiler_legacy(self.config())
        try:
            yield
        finally:
            records = torch.autograd._disable_profiler_legacy()
            _tls.session = prev
            self.add_legacy(records, threading.get_ident())
            with self._cond:
                self._pending -= 1
                ready = self._when_idle if self._pending == 0 else []
                if ready:
                    self._when_idle = []
                self._cond.notify_all()
            for fn in ready:
                fn()

    def when_idle(self, fn) -> None:
        """Run ``fn`` now, or when the captures in progress have added their records."""
        with self._cond:
            if self._pending:
                self._when_idle.append(fn)
                return
        fn()

    def close(self, wait_s: float = CAPTURE_WAIT_S) -> list[list[dict]]:
        """The session's records, once; later additions are dropped.

        Waits for captures in progress: the future a user waits on completes
        inside a capture, so the user can end the profile before that capture
        has handed over its records (torch records such callbacks straight
        into the caller's state, so they are never missing there).
        """
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0, timeout=wait_s)
            self._closed = True
            lists, self._lists = self._lists, []
            threads = dict(self._legacy_thread)
            node = self._node_id if self._node_id is not None else node_id()
        main = threads.get(self.thread, 0)
        for records in lists:  # synthetic ranges learn their thread's profiler id and node id now
            for r in records:
                if r["thread"] < 0:
                    r["thread"] = threads.get(-r["thread"], main)
                if r["node_id"] == UNKNOWN_NODE:
                    r["node_id"] = node
        return lists


def current_session() -> Session:
    session = getattr(_tls, "session", None)
    if session is None:
        session = profiling_hook.session_for_thread(threading.get_ident())
    if session is None:
        # The legacy profiler was enabled without profiler_legacy.profile (raw
        # torch.autograd._enable_profiler_legacy): its config is unknown and no
        # one merges extra records; remote events are dropped.
        session = Session(False, False)
        profiling_hook.open_session(threading.get_ident(), session)
    return session


profiling_hook.install(lambda record_shapes, profile_memory: Session(record_shapes, profile_memory))


# ------------------------------------------------------------ caller side
class Call:
    __slots__ = ("key", "session", "id", "record", "start_us", "thread", "error")

    def __init__(self, key: str, session: Session, profiling_id: int):
        self.key = key
        self.session = session
        self.id = profiling_id
        self.record = None  # torch's RecordFunction handle, in the user's profiling thread
        self.start_us = 0.0  # else: a synthetic range from here
        self.thread = threading.get_ident()
        self.error: ProfilingError | None = None  # a bad envelope: the user's future fails with it

    def __repr__(self):
        return f"<profiled RPC {self.key} id={self.id}>"


def _warn_kineto() -> None:
    if not _warned_kineto:
        _warned_kineto.append(True)
        warnings.warn(KINETO_WARNING, stacklevel=3)


def begin_call(mode: str, func, src_name: str, dst_name: str):
    """Start profiling one RPC (mode: sync, async, remote); None when the legacy profiler is off."""
    if not torch.autograd._profiler_enabled():
        return None
    if not legacy_profiling_on():
        _warn_kineto()
        return None
    session = current_session()
    call = Call(rpc_profiling_key(mode, function_name(func), src_name, dst_name), session, next_profiling_id())
    if session.owns_cpp_profiler():
        call.record = torch.ops.profiler._record_function_enter_new(call.key, None)
    else:
        call.start_us = profiling_records.now_us()
    return call


def request_fields(call: Call) -> dict:
    """The envelope: torch's RUN_WITH_PROFILING_REQ carries the config and the profiling id."""
    return {"id": call.id, "state": "CPU", "record_shapes": call.session.record_shapes,
            "profile_memory": call.session.profile_memory}


def wrap_future(call: Call, future):
    """The future the user gets: completes after the RPC's range ended, its callbacks profiled."""
    if call.record is not None:
        with torch._C.DisableTorchFunctionSubclass():
            ended = torch.ops.profiler._call_end_callbacks_on_jit_fut._RecordFunction(call.record, future)
    else:
        ended = future
    user = torch.futures.Future()

    def complete(_ended):
        if call.record is None:
            call.session.add_range(call.key, call.start_us, profiling_records.now_us(), call.thread, call.id)
        with call.session.capture():
            if call.error is not None:
                user.set_exception(call.error)
                return
            try:
                # the outcome comes from the agent's own future: a Python Future's
                # set_exception is only raised by that future (torch's C++ chain
                # would hand the exception object on as a value)
                value = future.value()
            except BaseException as exc:  # noqa: BLE001 - the RPC's error is the user's result
                user.set_exception(exc)
            else:
                user.set_result(value)

    ended.add_done_callback(complete)
    return user


def absorb_response(call: Call, envelope) -> None:
    """Keep the callee's events (None: an error or an unprofiled answer, nothing to keep)."""
    if envelope is None:
        return
    if not isinstance(envelope, dict) or envelope.get("id") != call.id or "events" not in envelope:
        # never raise into the agent's response path (its future would never
        # complete); the user's future fails with the reason instead
        got = envelope.get("id") if isinstance(envelope, dict) else type(envelope).__name__
        call.error = ProfilingError(f"profiling envelope {got!r} came back for {call!r}")
        return
    prefix = call.key + REMOTE_OP
    call.session.add([[remote_record(r, prefix) for r in records] for records in envelope["events"]])


# ------------------------------------------------------------ callee side
def run_profiled(fields: dict, run):
    """Run a request under the caller's profiler config; the future completes with (result, envelope)."""
    if torch.autograd._profiler_enabled():
        # This thread already profiles (a request run inline in a profiled
        # thread): a second legacy profiler cannot start here, so use a fresh one.
        result = torch.futures.Future()

        def relay():
            inner = run_profiled(fields, run)
            inner.add_done_callback(lambda f: _copy_outcome(f, result))

        threading.Thread(target=relay, name="distconform-rpc-profiled", daemon=True).start()
        return result
    record_shapes, profile_memory = callee_config(fields)
    session = Session(record_shapes, profile_memory, callee=True)
    result = torch.futures.Future()
    prev = getattr(_tls, "session", None)
    _tls.session = session
    torch.autograd._enable_profiler_legacy(session.config())
    try:
        fut = run()
    except BaseException as exc:  # noqa: BLE001 - the request's error travels to the caller
        fut = torch.futures.Future()
        fut.set_exception(exc)
    finally:
        records = torch.autograd._disable_profiler_legacy()
        _tls.session = prev
    session.add_legacy(records, threading.get_ident())
    collect_when_complete(fut, session, result, fields["id"])
    return result


def collect_when_complete(fut, session: Session, result, profiling_id: int) -> None:
    """Answer once the response is complete, with every event of the request (async work included)."""
    fut.add_done_callback(lambda done: session.when_idle(lambda: _answer(done, session, result, profiling_id)))


def _answer(done, session: Session, result, profiling_id: int, events=None) -> None:
    try:
        value = done.value()
    except BaseException as exc:  # noqa: BLE001 - the request failed: no events travel
        session.close()
        result.set_exception(exc)
        return
    result.set_result((value, {"id": profiling_id, "events": session.close() if events is None else events}))


def _copy_outcome(src, dst) -> None:
    try:
        value = src.value()
    except BaseException as exc:  # noqa: BLE001
        dst.set_exception(exc)
    else:
        dst.set_result(value)


# ------------------------------------------------------- the agent's own work
@contextlib.contextmanager
def _record_functions_off():
    torch._C._autograd._enable_record_function(False)  # thread-local (RecordFunction TLS)
    try:
        yield
    finally:
        torch._C._autograd._enable_record_function(True)


def unrecorded():
    """Around the agent's own work in a profiled thread (pickling, tensor copies, sends).

    TensorPipe does that work in C++, where the profiler does not see it; the
    reference agent does it with torch ops (clone, view, detach) that a
    profiler would otherwise list among the user's events. Free when no
    profiler is on. (torch has no getter for the flag: it is restored to on.)
    """
    if not torch.autograd._profiler_enabled():
        return _NOTHING
    return _record_functions_off()


_NOTHING = contextlib.nullcontext()  # reusable: the unprofiled path allocates nothing


# ------------------------------------------------------------------ RRefs
def to_here_scope(self_name: str, owner_name: str):
    """UserRRef.to_here: torch records "to_here#(self)->(owner)" under any profiler, and sends no envelope."""
    if not torch.autograd._profiler_enabled():
        return contextlib.nullcontext()
    return torch.autograd.profiler.record_function(f"to_here#({self_name})->({owner_name})")
