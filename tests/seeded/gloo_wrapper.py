"""GlooWrapper: gloo behind a Python ``ProcessGroup``, the base of the seeded-bug gallery.

Each module of ``tests/seeded`` subclasses ``GlooWrapper`` and overrides one
method to plant one bug a real backend author could make. The unbroken wrapper
(``tests/seeded/clean.py``) is the control: it must pass the whole suite
exactly like plain gloo, so whatever fails under a seeded module is that
module's bug, not the wrapping.

How torch 2.13 uses a Python ProcessGroup subclass (found by experiment and by
reading ``torch/distributed/distributed_c10d.py``):

* ``_new_process_group_helper`` sees that the creator returned a subclass of
  ``ProcessGroup`` and uses the object itself as the group; no backend is
  registered in it, so ``group._device_types`` is empty (object collectives
  then pick "cpu", which is right for gloo).
* Every ``dist.*`` function calls the group's method by its Python name, so
  the overrides below are what runs: ``all_gather_into_tensor`` calls
  ``all_gather_single``, ``reduce_scatter_tensor`` calls
  ``reduce_scatter_single``, ``all_to_all_single`` calls ``all_to_all_single``
  (``ProcessGroupGloo``, a ``Backend``, names them ``_allgather_base``,
  ``_reduce_scatter_base`` and ``alltoall_base``).
* ``batch_isend_irecv`` only coalesces when ``type(group) is ProcessGroup``;
  for a subclass it issues one isend/irecv per op, so no coalescing hook is
  needed. ``_coalescing_manager`` (a private API) calls ``_start_coalescing``/
  ``_end_coalescing`` and the ``*_coalesced`` fast paths; they are delegated too.
* ``dist.monitored_barrier`` refuses any backend whose name is not "gloo", so a
  wrapped gloo cannot offer it whatever it implements: ``register`` declares
  that as a gap.
* A group's name and description live on its registered backends; a Python
  group has none, so ``group_name`` raises "ProcessGroup name not set" (and
  ``destroy_process_group(subgroup)`` with it) unless the subclass keeps the
  name itself: ``_set_group_name``/``getGroupName`` (the C++ trampoline calls
  the Python ``getGroupName``) and the same for the description.
* ``group._get_backend(device)`` (a group's options, its ``supports_*`` flags)
  answers gloo for the cpu device, as for a plain gloo group.
* ``dist.recv`` without a source reads the sender from ``work._source_rank()``.
* ``group.merge_remote_group(...)`` on a Python group runs c10d's merge over
  the group's per-device backends, of which it has none: it returns None. The
  wrapper merges its plain ``inner_pg`` instead (a C++ ProcessGroup with gloo).
* The gloo ``Backend`` binding has no ``allgather_into_tensor_coalesced``,
  ``reduce_scatter_tensor_coalesced`` and friends; those go through a plain
  ``ProcessGroup`` holding the same gloo backend (``self.inner_pg``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo, _create_work_from_future

from backends.builtin import BUILTIN_SPECS
from backends.spec import MONITORED_BARRIER_GLOO_ONLY, PYTHON_PROCESS_GROUP_TAKES_EVERY_DEVICE

CPU = torch.device("cpu")


# ------------------------------------------------------------------ works
def completed_work(result=None):
    """A Work that is already complete (``result``: a tensor or list of tensors)."""
    future = torch.futures.Future()
    future.set_result([] if result is None else result)
    return _create_work_from_future(future)


class ThenWork(dist.Work):
    """Wait for ``inner``, then run ``after()`` once: post-processing of an async result."""

    def __init__(self, inner, after, result=None):
        super().__init__()
        self.inner, self.after, self.result_ = inner, after, result
        self._done = False
        self._lock = threading.Lock()

    def _finish(self) -> None:
        with self._lock:
            if not self._done:
                self.after()
                self._done = True

    def wait(self, timeout=None):
        if timeout is None:
            self.inner.wait()
        else:
            self.inner.wait(timeout)
        self._finish()
        return True

    def is_completed(self):
        if self._done:
            return True
        if self.inner.is_completed():
            self._finish()
            return True
        return False

    def is_success(self):
        return self.inner.is_success()

    def exception(self):
        return self.inner.exception()

    def result(self):
        self.wait()
        return self.result_ if self.result_ is not None else self.inner.result()

    def synchronize(self):
        self.wait()

    def get_future(self):
        future = torch.futures.Future()
        inner_future = self.inner.get_future()

        def done(fut):
            try:
                fut.value()
                self._finish()
                future.set_result(self.result_ if self.result_ is not None else fut.value())
            except Exception as exc:  # propagate the backend's error
                future.set_exception(exc)

        inner_future.add_done_callback(done)
        return future

    def _source_rank(self):
        return self.inner._source_rank()

    def source_rank(self):
        return self._source_rank()


def late_write(copies, delay: float = 0.5):
    """Copy each (src, dst) pair into place from a thread after ``delay`` seconds."""

    def write():
        time.sleep(delay)
        for src, dst in copies:
            dst.copy_(src)

    thread = threading.Thread(target=write, name="seeded-late-write", daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------ the wrapper
class GlooWrapper(dist.ProcessGroup):
    """gloo, delegated method by method. Subclasses override one method to seed a bug."""

    backend_name = "gloo_wrapped"

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self.timeout = timeout
        self.inner = ProcessGroupGloo(store, rank, size, self.inner_timeout(timeout))
        # The same gloo backend behind a plain ProcessGroup, for the methods
        # the Backend binding does not expose.
        self.inner_pg = dist.ProcessGroup(store, rank, size)
        self.inner_pg._register_backend(CPU, dist.ProcessGroup.BackendType.GLOO, self.inner)
        self.inner_pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

    def inner_timeout(self, timeout):
        """The timeout gloo itself is built with (a hook for the timeout bug)."""
        return timeout

    # ---------------------------------------------------------- identity
    def getBackendName(self):
        return self.backend_name

    def _get_backend_name(self):
        return self.backend_name

    # A Python ProcessGroup keeps its name and description on its registered
    # backends, and it has none: without these, pg.group_name raises
    # "ProcessGroup name not set" and destroy_process_group(subgroup) fails.
    def _set_group_name(self, name):
        self._group_name = name
        self.inner_pg._set_group_name(name)

    def getGroupName(self):
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc):
        self._group_desc = desc
        self.inner_pg._set_group_desc(desc)

    def getGroupDesc(self):
        return getattr(self, "_group_desc", "")

    def _get_backend(self, device):
        """gloo answers for the cpu device: a Python group registers no per-device backend, so c10d's lookup
        raises 'No backend type associated with device type cpu'; a caller asking for the backend (its
        options, its supports_* flags, suspend, memory_stats) gets the gloo this wrapper delegates to."""
        try:
            return super()._get_backend(device)
        except RuntimeError:
            if torch.device(device).type != "cpu":
                raise
            return self.inner

    def __repr__(self):
        return f"<{type(self).__name__} {self.backend_name} rank {self.rank()}/{self.size()}>"

    # ------------------------------------------------------- collectives
    def allreduce(self, tensors, opts=None):
        # torch also calls pg.allreduce(tensor) with one tensor and no options (DDP's
        # join hook with find_unused_parameters), as ProcessGroup's C++ binding allows
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        return self.inner.allreduce(tensors, dist.AllreduceOptions() if opts is None else opts)

    def allreduce_coalesced(self, tensors, opts):
        return self.inner.allreduce_coalesced(tensors, opts)

    def broadcast(self, tensors, opts):
        return self.inner.broadcast(tensors, opts)

    def reduce(self, tensors, opts):
        return self.inner.reduce(tensors, opts)

    def allgather(self, output_lists, input_tensors, opts):
        return self.inner.allgather(output_lists, input_tensors, opts)

    def _allgather_base(self, output, input, opts):
        return self.inner._allgather_base(output, input, opts)

    def all_gather_single(self, output, input, opts):
        return self._allgather_base(output, input, opts)

    def allgather_coalesced(self, output_lists, input_list, opts):
        return self.inner.allgather_coalesced(output_lists, input_list, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        return self.inner_pg.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        return self.inner_pg.all_gather_single_coalesced(outputs, inputs, opts)

    def gather(self, output_lists, input_tensors, opts):
        return self.inner.gather(output_lists, input_tensors, opts)

    def scatter(self, output_tensors, input_lists, opts):
        return self.inner.scatter(output_tensors, input_lists, opts)

    def reduce_scatter(self, output_tensors, input_lists, opts):
        return self.inner.reduce_scatter(output_tensors, input_lists, opts)

    def _reduce_scatter_base(self, output, input, opts):
        return self.inner._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts):
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        return self.inner_pg.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        return self.inner_pg.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def alltoall(self, output_tensors, input_tensors, opts):
        return self.inner.alltoall(output_tensors, input_tensors, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        return self.inner.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def barrier(self, opts=None):
        return self.inner.barrier(opts) if opts is not None else self.inner.barrier()

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        if timeout is None:
            timeout = self.timeout
        return self.inner.monitored_barrier(timeout, wait_all_ranks)

    # ---------------------------------------------------------------- p2p
    def send(self, tensors, dst, tag):
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self.inner.recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag):
        return self.inner.recv_anysource(tensors, tag)

    # --------------------------------------------------------- coalescing
    def _start_coalescing(self, device):
        return self.inner._start_coalescing()

    def _end_coalescing(self, device):
        return self.inner._end_coalescing()

    # c10d's sequence number lives in the backend; a Python group has none to ask
    def _get_sequence_number_for_group(self):
        return self.inner._get_sequence_number_for_group()

    def _set_sequence_number_for_group(self):
        return self.inner._set_sequence_number_for_group()

    # ------------------------------------------------------------ merging
    def merge_remote_group(self, store, size, timeout, group_name=None, group_desc=None):
        """gloo's merge, through the plain ProcessGroup over the same gloo: c10d's merge of a Python group asks
        its per-device backends, and it registers none, so without this the merge returns None."""
        return self.inner_pg.merge_remote_group(store, size, timeout, group_name, group_desc)

    # -------------------------------------------------------- life cycle
    def set_timeout(self, timeout):
        self.timeout = timeout
        return self.inner.set_timeout(timeout)

    def shutdown(self):
        return self.inner.shutdown()

    def abort(self):
        return self.inner.abort()


# -------------------------------------------------------------- registering
WRAPPER_GAPS = (
    MONITORED_BARRIER_GLOO_ONLY,
    PYTHON_PROCESS_GROUP_TAKES_EVERY_DEVICE,  # the wrapper is a Python ProcessGroup
)


def register(name: str, cls: type, description: str = ""):
    """Register ``cls`` with torch as backend ``name``; return its spec (gloo's gaps apply).

    The returned spec is meant to be the plugin module's ``DISTCONFORM_SPEC``:
    gloo's own known gaps still turn into xfails, so only the seeded bug shows.
    """

    def create(store, rank, size, timeout):
        pg = cls(store, rank, size, timeout)
        pg.backend_name = name
        return pg

    if name.upper() not in dist.Backend._plugins:  # importing twice must not fail
        dist.Backend.register_backend(name, create, devices=["cpu"])
    gloo = BUILTIN_SPECS["gloo"]
    summary = (cls.__doc__ or "").strip().splitlines()
    return dataclasses.replace(
        gloo,
        name=name,
        gaps=WRAPPER_GAPS,
        inherits="gloo",  # the registry adds gloo's own gaps after these (backends/spec.py)
        description=description or f"gloo wrapped by {cls.__name__}" + (f": {summary[0]}" if summary else ""),
    )


# A timeout long enough to count as "never" within any test run.
LONG_TIMEOUT = timedelta(days=1)
