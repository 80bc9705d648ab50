"""The reference DDP: torch 2.13's DistributedDataParallel reducer, re-implemented in plain Python.

It runs over any process group (gloo, nccl, the project's ``reference``
backend, a Python ProcessGroup) and is the oracle the DDP suite compares
torch's C++ reducer with. Read it in this order:

* ``params.py``: which parameters are managed (requires_grad, not ignored,
  shared parameters once: PyTorch issue 41324) and the construction-time
  checks and broadcast;
* ``buckets.py``: bucket assignment (caps, the 1 MiB first bucket, dtype and
  device grouping, reversed order) and the rebuild after the first iteration;
* ``reducer.py``: hooks, readiness, launch in bucket order, averaging,
  unused parameters (globally versus locally), static graph, finalize;
* ``comm_hooks.py``: the GradBucket a comm hook sees, and the allreduce and
  fp16-compress hooks (torch's own default_hooks work too);
* ``join.py``: how a rank that ran out of inputs shadows the others' DDP
  collectives under ``torch.distributed.algorithms.Join``;
* ``data_parallel.py``: the module wrapper, forward before/after steps.

Interface (the same as ``torch.nn.parallel.DistributedDataParallel``)::

    DistributedDataParallel(module, device_ids=None, output_device=None, broadcast_buffers=True,
                            process_group=None, bucket_cap_mb=None, find_unused_parameters=False,
                            gradient_as_bucket_view=False, static_graph=False)

``forward``, ``module``, ``no_sync()``, ``register_comm_hook(state, hook)``,
``join(divide_by_initial_world_size=True, enable=True,
throw_on_early_termination=False)`` (torch's ``Join``), the ``Joinable``
interface (``join_hook``, ``join_device``, ``join_process_group``) so that
``Join([ddp, other_joinable])`` works, ``_authoritative_rank`` after a join,
and the static method ``_set_params_and_buffers_to_ignore_for_model(module,
names)``. Error texts are torch's (unused parameters, marked twice, static
graph changed, no trainable parameter, comm hook registered twice).

Observables for the suite (torch's DDP has no public equivalent; the suite
reads torch's from ``ddp.reducer._get_zeros_like_grad_buckets()``):

* ``ddp.bucket_indices()``: per bucket, in reducer order (bucket 0 is
  reduced first), the indices into ``ddp.managed_parameters()`` (the managed
  parameters in managed order);
* ``ddp.bucket_numels()``: number of elements of each bucket's flat buffer.

Where it deliberately differs from torch 2.13 (tests/test_reference_ddp_*.py
checks everything else against torch, gradients bit for bit):

* parameter shapes that differ between ranks raise on every rank (torch
  raises on the mismatching rank only; rank 0 waits in a broadcast);
* a rank that joins before its first backward adds zeros to the
  used-parameter all-reduce (torch adds an uninitialised ``at::empty`` map);
* the "did not find any unused parameters" notice is a Python warning, once
  per DDP (torch: a C++ warning on stderr, once per process).

Sparse gradients (``nn.Embedding(sparse=True)``): each such parameter is a
bucket of its own whose sparse gradient is divided in place and all-reduced
as it is (the backend's sparse all-reduce), the sum copied back into it.
Inside a distributed autograd context of the reference agents
(backends/reference/rpc/autograd) the reducer reads and writes the gradients
there, not ``.grad``, as torch's (reducer.cpp ``runGradCallbackForVariable``).

Not implemented: mixed precision, buffer comm hooks,
``delay_all_reduce_named_params`` and the other arguments torch 2.13 added
beyond the interface above.
"""

from .comm_hooks import GradBucket, allreduce_hook, fp16_compress_hook
from .data_parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel", "GradBucket", "allreduce_hook", "fp16_compress_hook"]
