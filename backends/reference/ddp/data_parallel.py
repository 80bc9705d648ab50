"""``DistributedDataParallel``: the module wrapper around the reducer.

Construction: choose the managed parameters (params.py), check every rank
has the same model, broadcast rank 0's parameters and buffers, assign
buckets (buckets.py) and hand them to the reducer in *reversed* order
(reducer.py).

Each forward (``_pre_forward`` / ``_post_forward``, as in torch 2.13):

* before: count the iteration (synced, grad-enabled forwards only), tell a
  Join context this rank is still active, rebuild buckets if due (which first
  raises if the previous reduction never finished), broadcast buffers from the
  authoritative rank, and in a Join context all-reduce "do we sync gradients
  this iteration";
* after: arm the reducer for backward (with the outputs, to search unused
  parameters) and, when unused parameters are searched or a static graph is
  in its first iteration, pass the outputs through an identity autograd
  function (``_OutputSink``) so that outputs not used by the loss still run
  their parameters' hooks (with no gradient) and the static graph's delayed
  reduction gets queued.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
import weakref
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.distributed.algorithms.join import Join, Joinable
from torch.utils._pytree import tree_flatten, tree_unflatten

from .buckets import BucketCaps, compute_bucket_assignment_by_size
from .join import DDPJoinHook
from .params import (
    NO_TRAINABLE_PARAMETERS,
    broadcast_coalesced,
    buffers_to_sync,
    managed_parameters,
    names_to_ignore,
    set_params_and_buffers_to_ignore,
    sync_module_states,
    verify_same_model,
)
from .reducer import Reducer


def reducer_order(assignment: list) -> list:
    """Buckets as the reducer numbers them: reversed, because backward produces the last
    parameters' gradients first, so bucket 0 (launched first) holds the last-defined parameters."""
    return list(reversed(assignment))


def find_tensors(obj) -> list[torch.Tensor]:
    """Every tensor in a forward's output: in tensors, lists, tuples, dict values and dataclasses."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in find_tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in find_tensors(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in find_tensors(getattr(obj, f.name))]
    return []


class _OutputSink(torch.autograd.Function):
    """Identity on the outputs; in backward, queues the static graph's first reduction.

    Being one node above every output, it makes the autograd engine run the
    branches of outputs the loss did not use too (with undefined gradients),
    so their parameters' hooks fire and the reducer can finish.
    """

    @staticmethod
    def forward(ctx, ddp_ref, *outputs):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not zeros
        ctx.ddp_ref = ddp_ref
        return tuple(t.clone() for t in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ddp = ctx.ddp_ref()
        if ddp is not None and ddp.static_graph and not ddp._static_graph_delay_allreduce_enqueued:
            Variable._execution_engine.queue_callback(ddp.reducer.delay_all_reduce)
            ddp._static_graph_delay_allreduce_enqueued = True
        return (None, *grads)


class DistributedDataParallel(torch.nn.Module, Joinable):
    """Data parallelism over a process group, gradients averaged during backward (torch's arguments)."""

    def __init__(self, module, device_ids=None, output_device=None, broadcast_buffers=True, process_group=None,
                 bucket_cap_mb=None, find_unused_parameters=False, gradient_as_bucket_view=False,
                 static_graph=False):
        super().__init__()
        Joinable.__init__(self)
        self.process_group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        self.parameters_to_ignore = names_to_ignore(module)
        self._module_parameters = [p for n, p in module.named_parameters() if n not in self.parameters_to_ignore]
        if not any(p.requires_grad for p in self._module_parameters):
            raise RuntimeError(NO_TRAINABLE_PARAMETERS)
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        self.is_multi_device_module = len({p.device for p in self._module_parameters}) > 1
        device_types = {p.device.type for p in self._module_parameters}
        if len(device_types) != 1:
            raise ValueError("DistributedDataParallel's input module must be on the same type of devices, but "
                             f"input module parameters locate in {device_types}.")
        self.device_type = next(iter(device_types))
        if not device_ids or self.device_type == "cpu" or self.is_multi_device_module:
            if device_ids or output_device:
                devices = {p.device for p in self._module_parameters}
                raise ValueError(
                    "DistributedDataParallel device_ids and output_device arguments only work with "
                    "single-device/multiple-device GPU modules or CPU modules, but got device_ids "
                    f"{device_ids}, output_device {output_device}, and module parameters {devices}.")
            self.device_ids = None
            self.output_device = None
        else:
            self.device_ids = [torch.device(self.device_type, d).index if isinstance(d, int)
                               else torch.device(d).index for d in device_ids]
            out = device_ids[0] if output_device is None else output_device
            self.output_device = out if isinstance(out, int) else torch.device(out).index

        self.module = module
        self.device = next(iter(self._module_parameters)).device
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.require_forward_param_sync = True
        self.static_graph = False
        self._static_graph_delay_allreduce_enqueued = False
        self._divide_by_initial_world_size = True
        self._pending_work = None

        self._bucket_caps = BucketCaps.from_argument(bucket_cap_mb)
        self.bucket_bytes_cap = self._bucket_caps.bucket_bytes_cap
        params, expect_sparse, names = managed_parameters(module, self.parameters_to_ignore)
        verify_same_model(self.process_group, params)
        sync_module_states(module, self.process_group, 0, self.parameters_to_ignore, broadcast_buffers)
        indices, limits = compute_bucket_assignment_by_size(
            params, self._bucket_caps.initial_limits(static_graph, find_unused_parameters), expect_sparse)
        self.reducer = Reducer(params, reducer_order(indices), self.process_group, self._bucket_caps,
                               find_unused_parameters, gradient_as_bucket_view, names,
                               bucket_size_limits=reducer_order(limits), expect_sparse_gradient=expect_sparse)
        self._comm_hooks: list = []
        self._has_rebuilt_buckets = False
        if static_graph:
            self._set_static_graph()

    # ------------------------------------------------------------ observables
    def bucket_indices(self) -> list[list[int]]:
        """Managed-parameter indices of each bucket, reducer bucket 0 (reduced first) first."""
        return self.reducer.bucket_indices()

    def bucket_numels(self) -> list[int]:
        """Elements in each bucket's flat buffer, in reducer order."""
        return [b.buffer.numel() for b in self.reducer.buckets]

    def managed_parameters(self) -> list[torch.Tensor]:
        """The parameters the reducer manages; ``bucket_indices()`` indexes this list."""
        return list(self.reducer.params)

    # ------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        with torch.autograd.profiler.record_function("DistributedDataParallel.forward"):
            inputs, kwargs = self._pre_forward(*inputs, **kwargs)
            output = self.module(*inputs, **kwargs)
            return self._post_forward(output)

    def _pre_forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.reducer.prepare_for_forward()
        work = Join.notify_join_context(self)
        if work:
            self.reducer.set_forward_pass_work_handle(work, self._divide_by_initial_world_size)
        if torch.is_grad_enabled() and self.reducer.rebuild_buckets():
            self._has_rebuilt_buckets = True
        if self.will_sync_module_buffers():
            self._sync_buffers()
        if self._join_config.enable:
            self._check_global_requires_backward_grad_sync(is_joined_rank=False)
        if self.device_ids:
            from torch.distributed.utils import _to_kwargs

            moved_inputs, moved_kwargs = _to_kwargs(inputs, kwargs, torch.device(self.device_type, self.device_ids[0]),
                                                    True)
            return moved_inputs[0], moved_kwargs[0]
        return inputs, kwargs

    def _post_forward(self, output):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            if self.find_unused_parameters and not self.static_graph:
                self.reducer.prepare_for_backward(find_tensors(output))
            else:
                self.reducer.prepare_for_backward([])
        else:
            self.require_forward_param_sync = False
        if (self.find_unused_parameters and not self.static_graph) or (
                self.static_graph and not self._static_graph_delay_allreduce_enqueued):
            output = self._through_sink(output)
        return output

    def _through_sink(self, output):
        leaves, spec = tree_flatten(output)
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None]
        if not positions:
            return output
        passed = _OutputSink.apply(weakref.ref(self), *[leaves[i] for i in positions])
        for i, tensor in zip(positions, passed):
            leaves[i] = tensor
        return tree_unflatten(leaves, spec)

    @contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first synced backward after it reduces them."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ------------------------------------------------------------ buffers
    def will_sync_module_buffers(self) -> bool:
        return (self.require_forward_param_sync and self.broadcast_buffers
                and len(buffers_to_sync(self.module, self.parameters_to_ignore)) > 0)

    @property
    def _distributed_rank(self) -> int:
        return dist.get_rank(self.process_group)

    def _find_common_rank(self, input_rank: int, rank_cond: bool) -> int:
        """The highest rank among those where ``rank_cond`` holds (MAX all-reduce of rank or -1)."""
        rank_to_use = torch.tensor([input_rank if rank_cond else -1], device=self.device)
        dist.all_reduce(rank_to_use, op=dist.ReduceOp.MAX, group=self.process_group)
        if rank_to_use.item() == -1:
            raise ValueError("BUG! Expected rank_cond to be true for at least one process. This indicates a bug "
                             "in PyTorch, please report an issue.")
        return int(rank_to_use.item())

    def _sync_buffers(self) -> None:
        with torch.no_grad():
            # in a Join context rank 0 may have joined with stale buffers: take the highest active rank's
            authoritative_rank = (self._find_common_rank(self._distributed_rank, True)
                                  if self._join_config.enable else 0)
            self._sync_module_buffers(authoritative_rank)

    def _sync_module_buffers(self, authoritative_rank: int) -> None:
        buffers = list(buffers_to_sync(self.module, self.parameters_to_ignore).values())
        with torch.autograd._unsafe_preserve_version_counter(tuple(buffers)):
            broadcast_coalesced(self.process_group, buffers, authoritative_rank)

    def _check_and_sync_module_buffers(self) -> None:
        """Joined rank: take part in the buffer sync, never as its source."""
        if self.will_sync_module_buffers():
            authoritative_rank = self._find_common_rank(self._distributed_rank, False)
            self._sync_module_buffers(authoritative_rank)

    # ------------------------------------------------------------ Join
    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False):
        """torch's ``Join`` context over this module (uneven inputs); see join.py."""
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs):
        return DDPJoinHook(self, divide_by_initial_world_size=kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self):
        return self.device

    @property
    def join_process_group(self):
        return self.process_group

    def _check_global_requires_backward_grad_sync(self, is_joined_rank: bool):
        """All-reduce of "this rank syncs gradients now" (1 or 0); a joined rank learns the sum."""
        wants = not is_joined_rank and self.require_backward_grad_sync
        flag = (torch.ones if wants else torch.zeros)(1, device=self.device)
        work = dist.all_reduce(flag, group=self.process_group, async_op=True)
        if is_joined_rank:
            work.wait()
            return flag.item() != 0
        self._pending_work = (work, flag)  # active ranks do not wait (torch neither)
        return None

    def _match_all_reduce_for_bwd_pass(self) -> None:
        futures = [self.reducer.run_comm_hook(b) for b in self.reducer.get_zeros_like_grad_buckets()]
        for future in futures:
            future.wait()

    def _match_unused_params_allreduce(self) -> None:
        dist.all_reduce(self.reducer.get_local_used_map(), group=self.process_group)

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        self._authoritative_rank = self._find_common_rank(self._distributed_rank, is_last_joiner)
        sync_module_states(self.module, self.process_group, self._authoritative_rank, self.parameters_to_ignore,
                           self.broadcast_buffers)

    # ------------------------------------------------------------ hooks, static graph, ignore list
    def register_comm_hook(self, state: object, hook) -> None:
        """``hook(state, bucket) -> Future[Tensor]`` reduces each bucket instead of SUM all-reduce (once)."""
        self._check_comm_hook(hook)
        self.reducer.register_comm_hook(state, hook)
        self._comm_hooks.append((hook, state))

    @staticmethod
    def _check_comm_hook(hook) -> None:
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        sig = inspect.signature(hook)
        bucket = sig.parameters.get("bucket")
        if bucket is not None and bucket.annotation not in (inspect.Parameter.empty, dist.GradBucket, "dist.GradBucket"):
            raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
        if sig.return_annotation not in (inspect.Signature.empty, torch.futures.Future[torch.Tensor],
                                         "torch.futures.Future[torch.Tensor]"):
            raise ValueError("Communication hook: return annotation should be torch.futures.Future[torch.Tensor].")

    def _set_static_graph(self) -> None:
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.", stacklevel=2)
            return
        self.static_graph = True
        self._static_graph_delay_allreduce_enqueued = False
        self.reducer.set_static_graph()
        if self.find_unused_parameters:
            warnings.warn(
                "You passed find_unused_parameters=true to DistributedDataParallel, `_set_static_graph` will detect "
                "unused parameters automatically, so you do not need to set find_unused_parameters=true, just be sure "
                "these unused parameters will not change during training loop while calling `_set_static_graph`.",
                stacklevel=2)

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore) -> None:
        """Names (``"{module}.{param}"``) DDP must neither broadcast nor reduce."""
        set_params_and_buffers_to_ignore(module, params_and_buffers_to_ignore)

    def _remove_autograd_hooks(self) -> None:
        self.reducer.remove_autograd_hooks()
