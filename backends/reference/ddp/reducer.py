"""The reducer: turns each rank's local gradients into the average over ranks, during backward.

A readable model of torch's C++ ``Reducer`` (torch/csrc/distributed/c10d/reducer.cpp),
step by step, per iteration:

1. ``prepare_for_forward`` counts the iteration; ``rebuild_buckets`` (before
   the forward) first checks the previous iteration's reduction finished
   (otherwise the "Expected to have finished reduction ..." error naming the
   parameters that never got a gradient), then, once, rebuilds the buckets in
   gradient-ready order.
2. ``prepare_for_backward(outputs)`` (after the forward) arms the hooks and,
   with ``find_unused_parameters``, walks the autograd graph from the outputs:
   parameters whose AccumulateGrad node is not reached are *unused* this
   iteration.
3. A post-hook on every parameter's AccumulateGrad node (``_autograd_hook``)
   fires when its gradient is accumulated. The first one also marks the unused
   parameters ready (zeros). ``mark_variable_ready`` copies the gradient,
   divided by the divide factor, into the parameter's view of its bucket's
   flat buffer; a bucket whose gradients are all in is *ready*; buckets are
   launched (async all-reduce, or the comm hook) strictly in index order, so
   every rank issues the same collectives in the same order.
4. After the last bucket (and, with ``find_unused_parameters``, the all-reduce
   of the int32 map of locally used parameters) a callback queued on the
   autograd engine runs ``finalize_backward`` when backward ends: wait for
   every bucket and copy the reduced values back into ``.grad``; a parameter
   unused on every rank keeps its ``.grad`` untouched.

Inside a distributed autograd context (backends/reference/rpc/autograd) the
gradients live in the context, not in ``.grad``: as torch's reducer
(``runGradCallbackForVariable``), each hook remembers the context the engine
runs it in (backends/reference/grad_context.py), reads the parameter's
gradient from it and ``finalize_backward`` writes the average back into it;
``.grad`` stays untouched.

Static graph (``static_graph=True``): the first iteration only counts hook
calls; at the end of its backward ``delay_all_reduce`` reduces everything at
once and records the parameters unused in it, which stay unused for good.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Variable

from .. import grad_context
from .buckets import (
    Bucket,
    BucketCaps,
    compute_bucket_assignment_by_size,
    non_overlapping_and_dense,
    sync_bucket_indices,
)
from .comm_hooks import GradBucket, allreduce_by_sum

UNSET_DIV_FACTOR = -1

# ---------------------------------------------------------------- torch's error texts
MARKED_TWICE = (
    "Expected to mark a variable ready only once. This error is caused by one of the following reasons: "
    "1) Use of a module parameter outside the `forward` function. Please make sure model parameters are not "
    "shared across multiple concurrent forward-backward passes. or try to use _set_static_graph() as a "
    "workaround if this module graph does not change during training loop.2) Reused parameters in multiple "
    "reentrant backward passes. For example, if you use multiple `checkpoint` functions to wrap the same part "
    "of your model, it would result in the same set of parameters been used by different reentrant backward "
    "passes multiple times, and hence marking a variable ready multiple times. DDP does not support such use "
    "cases in default. You can try to use _set_static_graph() as a workaround if your module graph does not "
    "change over iterations.\nParameter at index {index} with name {name} has been marked as ready twice. "
    "This means that multiple autograd engine  hooks have fired for this particular parameter during this "
    "iteration."
)
PRIOR_REDUCTION_BASE = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your module has parameters that were not used in producing loss. "
)
PRIOR_REDUCTION_STATIC_GRAPH = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your training graph has changed in this iteration, e.g., one parameter is used in first "
    "iteration, but then got unused in the second iteration. this is not compatible with static_graph set to True."
)
OUTPUTS_NOT_USED = "making sure all `forward` function outputs participate in calculating loss. "
DDP_BUG = (
    "\nIf you already have done the above, then the distributed data parallel module wasn't able to locate "
    "the output tensors in the return value of your module's `forward` function. Please include the loss "
    "function and the structure of the return value of `forward` of your module when reporting this issue "
    "(e.g. list, dict, iterable)."
)
ENABLE_FIND_UNUSED = (
    "You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` "
    "to `torch.nn.parallel.DistributedDataParallel`, and by \n"
)
FIND_UNUSED_ENABLED = (
    "Since `find_unused_parameters=True` is enabled, this likely  means that not all `forward` outputs "
    "participate in computing loss. You can fix this by "
)
DEBUG_HINT = (
    "\n In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to "
    "print out information about which particular parameters did not receive gradient on this rank as part of "
    "this error"
)
GRAPH_CHANGED = (
    "Your training graph has changed in this iteration, e.g., one parameter is unused in first iteration, but "
    "then got used in the second iteration. this is not compatible with static_graph set to True."
)
NO_UNUSED_FOUND = (
    "find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters in "
    "the forward pass. This flag results in an extra traversal of the autograd graph every iteration,  which "
    "can adversely affect performance. If your model indeed never has any unused parameters in the forward "
    "pass, consider turning this flag off. Note that this warning may be a false positive if your model has "
    "flow control causing later iterations to have unused parameters."
)
UNDEFINED_BUT_REDUCED = (
    "Encountered gradient which is undefined, but still allreduced by DDP reducer. This indicates a bug in DDP "
    "implementation, please report a bug with a repro to PyTorch."
)
NOT_A_BUCKET_VIEW = (
    "Detected at least one parameter gradient is not the expected DDP bucket view with "
    "gradient_as_bucket_view=True. This may happen (for example) if multiple allreduce hooks were registered "
    "onto the same parameter. If you hit this error, please file an issue with a minimal repro."
)
HOOK_TWICE = "register_comm_hook or register_builtin_comm_hook can only be called once."
STATIC_GRAPH_TOO_LATE = (
    "set_static_graph() should be called before training loop starts and after DistributedDataParallel is "
    "constructed."
)


def grad_accumulator(param: torch.Tensor):
    """The AccumulateGrad node of a leaf parameter (created on first request, shared by all its uses)."""
    with torch.enable_grad():  # DDP may be built under no_grad; the node must exist anyway
        return param.view_as(param).grad_fn.next_functions[0][0]


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a.is_alias_of(b)`` in C++: the two tensors are views of one storage."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def clone_obey_contract(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A new gradient for ``param`` with the parameter's layout (the gradient layout contract)."""
    if non_overlapping_and_dense(param):
        return torch.empty_strided(param.shape, param.stride(), dtype=param.dtype, device=param.device).copy_(value)
    return value.clone(memory_format=torch.contiguous_format)


def reachable_nodes(outputs) -> set[int]:
    """ids of every autograd node reachable from the outputs' grad_fns (a DFS over next_functions)."""
    keep_alive, seen, stack = [], set(), []
    for output in outputs:
        if output.grad_fn is not None:
            stack.append(output.grad_fn)
    while stack:
        node = stack.pop()
        for next_node, _ in node.next_functions:
            if next_node is not None and id(next_node) not in seen:
                seen.add(id(next_node))
                keep_alive.append(next_node)  # ids stay unique while the objects live
                stack.append(next_node)
    return seen


class Reducer:
    """Gradient reduction for one DDP module over one process group."""

    def __init__(self, params, bucket_indices, process_group, caps: BucketCaps, find_unused_parameters: bool,
                 gradient_as_bucket_view: bool, param_names: dict[int, str], bucket_size_limits=None,
                 expect_sparse_gradient: list[bool] | None = None):
        if not params:
            raise ValueError("the reducer needs at least one parameter")
        self.params = list(params)
        # per parameter: its gradient is sparse (nn.Embedding(sparse=True)); such a parameter is a bucket of
        # its own, reduced as the sparse tensor itself (torch's mark_variable_ready_sparse)
        self.expect_sparse = list(expect_sparse_gradient or [False] * len(self.params))
        self.sparse_grads: dict[int, torch.Tensor] = {}  # bucket index -> this iteration's sparse gradient
        self.process_group = process_group
        self.caps = caps
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.param_names = param_names
        self.device = self.params[0].device
        self.static_graph = False
        self.comm_hook: tuple | None = None  # (state, hook)
        self._lock = threading.RLock()  # hooks may fire on autograd engine threads (one per device)

        # per iteration
        self.num_iterations = 0
        self.expect_autograd_hooks = False
        self.require_finalize = False
        self.has_marked_unused_parameters = False
        self.unused_parameters: list[int] = []
        self.ready_this_iteration: set[int] = set()
        self.grad_ready_order: list[int] = []
        self.next_bucket = 0
        self.div_factor = UNSET_DIV_FACTOR
        self.forward_pass_work = None  # the Join "not joined yet" all-reduce of this iteration
        self.use_static_world_size = True
        self._warned_no_unused = False
        # the distributed autograd context of this iteration's hooks (torch's rpc_context_), None outside one
        self.rpc_context: grad_context.GradStore | None = None

        # bucket rebuild: parameters in the order their gradients became ready
        self.has_rebuilt_buckets = False
        self.rebuilt_params: list[torch.Tensor] = []
        self.rebuilt_param_indices: list[int] = []

        # static graph: how often each hook fired in iteration 1, and what is left this iteration
        self.hook_counts = [0] * len(self.params)
        self.hook_counts_this_iteration = list(self.hook_counts)

        # used parameters: local map (CPU), the copy that is all-reduced (on the parameters' device)
        self.local_used_map = torch.zeros(len(self.params), dtype=torch.int32)
        self.local_used_map_dev = torch.zeros(len(self.params), dtype=torch.int32, device=self.device)
        # the used-map all-reduce's Work (torch is read as Any); None until all_reduce_local_used_map(). Not
        # narrowed: its waits rely on the call order of DDP's backward, which is not provable here.
        self.local_used_work: Any = None
        self.local_used_map_reduced = False

        self.buckets: list[Bucket] = []
        self.locators: list[tuple[int, int]] = []
        self.initialize_buckets(bucket_indices, bucket_size_limits)

        # One post-hook per AccumulateGrad node. Shared parameters were
        # de-duplicated before, so each node maps to one index; the map keeps a
        # list anyway, which is the fix of issue 41324 inside the reducer.
        self._accumulators = []
        self._hook_handles = []
        self.accumulator_to_indices: dict[int, list[int]] = {}
        me = weakref.ref(self)  # hooks hold the reducer weakly: once it is dropped they do nothing
        for index, param in enumerate(self.params):
            node = grad_accumulator(param)
            self._accumulators.append(node)  # the tensor holds its accumulator weakly
            self.accumulator_to_indices.setdefault(id(node), []).append(index)
            self._hook_handles.append(node.register_hook(_hook_for(me, index)))

    # ------------------------------------------------------------ properties of the mode
    @property
    def dynamic_graph_find_unused(self) -> bool:
        return self.find_unused_parameters and not self.static_graph

    @property
    def static_graph_first_iteration(self) -> bool:
        return self.static_graph and self.num_iterations == 1

    @property
    def static_graph_after_first_iteration(self) -> bool:
        return self.static_graph and self.num_iterations > 1

    @property
    def should_rebuild_buckets(self) -> bool:
        return (self.static_graph or not self.find_unused_parameters) and not self.has_rebuilt_buckets

    # ------------------------------------------------------------ buckets
    def initialize_buckets(self, bucket_indices, bucket_size_limits=None) -> None:
        seen = sorted(i for bucket in bucket_indices for i in bucket)
        if seen != list(range(len(self.params))):
            raise RuntimeError(f"bucket indices must cover every parameter index 0..{len(self.params) - 1} "
                               f"exactly once, got {bucket_indices}")
        limits = list(bucket_size_limits or [0] * len(bucket_indices))
        self.buckets = [Bucket.build(b, indices, self.params, limits[b] if b < len(limits) else 0)
                        for b, indices in enumerate(bucket_indices)]
        self.locators = [(-1, -1)] * len(self.params)
        for bucket in self.buckets:
            for intra, index in enumerate(bucket.variable_indices):
                self.locators[index] = (bucket.index, intra)
        if self.gradient_as_bucket_view:
            # a gradient from before (rebuild) moves into its new bucket view; a missing one stays
            # missing, so that a globally unused parameter keeps grad None
            with torch.no_grad():
                for bucket in self.buckets:
                    for param, view in zip(bucket.variables, bucket.views_in):
                        if param.grad is not None and not shares_storage(param.grad, view):
                            view.copy_(param.grad)
                            param.grad = view

    def rebuild_buckets(self) -> bool:
        """Before each forward: insist the last reduction finished; rebuild buckets once. True if rebuilt."""
        with self._lock:
            self.ensure_prior_reduction_finished()
            if not self.should_rebuild_buckets or not self.rebuilt_params:
                return False
            if len(self.rebuilt_param_indices) != len(self.params):
                raise RuntimeError(
                    "rebuilt parameter indices size is not same as original model parameters size.Original model "
                    f"param size is: {len(self.params)} while rebuilt param size is: {len(self.rebuilt_param_indices)}")
            indices, limits = compute_bucket_assignment_by_size(
                self.rebuilt_params, self.caps.rebuild_limits(), self.expect_sparse, self.rebuilt_param_indices)
            synced = sync_bucket_indices(indices, self.process_group, self.device)
            self.has_rebuilt_buckets = True
            self.rebuilt_params, self.rebuilt_param_indices = [], []
            self.initialize_buckets(synced, limits if synced == indices else None)
            return True

    def push_rebuilt_param(self, index: int) -> None:
        self.rebuilt_params.append(self.params[index])
        self.rebuilt_param_indices.append(index)

    def push_all_rebuilt_params(self) -> None:
        """A joined rank has no ready order of its own: it offers index order to the rebuild."""
        with self._lock:
            if not self.should_rebuild_buckets or self.rebuilt_param_indices:
                return
            for index in range(len(self.params)):
                self.push_rebuilt_param(index)

    # ------------------------------------------------------------ iteration
    def prepare_for_forward(self) -> None:
        with self._lock:
            self.num_iterations += 1

    def ensure_prior_reduction_finished(self) -> None:
        if not self.require_finalize:
            return
        unmarked = [i for i in range(len(self.params)) if i not in self.ready_this_iteration]
        if self.static_graph:
            message = PRIOR_REDUCTION_STATIC_GRAPH
        elif not self.find_unused_parameters:
            message = PRIOR_REDUCTION_BASE + ENABLE_FIND_UNUSED + OUTPUTS_NOT_USED + DDP_BUG
        else:
            message = PRIOR_REDUCTION_BASE + FIND_UNUSED_ENABLED + OUTPUTS_NOT_USED + DDP_BUG
        rank = dist.get_rank(self.process_group)
        message += f"\nParameter indices which did not receive grad for rank {rank}: {' '.join(map(str, unmarked))}"
        raise RuntimeError(message + DEBUG_HINT)

    def prepare_for_backward(self, outputs) -> None:
        """After a synced forward: expect every hook once; find this iteration's unused parameters."""
        with self._lock:
            self.expect_autograd_hooks = True
            self.grad_ready_order = []
            self.reset_bucket_counting()
            self.has_marked_unused_parameters = False
            self.ready_this_iteration = set()
            if self.dynamic_graph_find_unused:
                self.unused_parameters = self.search_unused_parameters(outputs)

    def reset_bucket_counting(self) -> None:
        self.next_bucket = 0
        for bucket in self.buckets:
            bucket.pending = len(bucket.variables)
            bucket.future = None
        if self.static_graph:
            self.hook_counts_this_iteration = list(self.hook_counts)

    def search_unused_parameters(self, outputs) -> list[int]:
        """Parameters whose AccumulateGrad no output reaches: they get no gradient this iteration."""
        reached = reachable_nodes(outputs)
        unused = sorted(index for node_id, indices in self.accumulator_to_indices.items()
                        if node_id not in reached for index in indices)
        if not unused and not self._warned_no_unused:
            self._warned_no_unused = True
            warnings.warn(NO_UNUSED_FOUND, stacklevel=4)
        return unused

    # ------------------------------------------------------------ hooks and readiness
    def autograd_hook(self, index: int) -> None:
        """A parameter's gradient was accumulated (or its node ran without one)."""
        with self._lock:
            self.rpc_context = grad_context.current()
            if self.dynamic_graph_find_unused or self.static_graph_first_iteration:
                # used = got a defined gradient; counts inside no_sync too, until the next synced backward
                if self.grad_of(self.params[index]) is not None:
                    self.local_used_map[index] = 1
            if not self.expect_autograd_hooks:
                return  # no_sync, or a backward after this iteration's reduction finished
            self.grad_ready_order.append(index)
            if self.static_graph_first_iteration:
                self.hook_counts[index] += 1  # iteration 1 only counts; delay_all_reduce reduces
                return
            if not self.has_marked_unused_parameters:
                self.has_marked_unused_parameters = True
                self.mark_unused_parameters_ready()
            if self.static_graph_after_first_iteration:
                if self.hook_counts_this_iteration[index] <= 0:
                    raise RuntimeError(GRAPH_CHANGED)
                self.hook_counts_this_iteration[index] -= 1
                if self.hook_counts_this_iteration[index] > 0:
                    return  # used several times (reentrant checkpoint): ready at its last hook
            if self.should_rebuild_buckets:
                self.push_rebuilt_param(index)
            self.mark_variable_ready(index)

    def mark_unused_parameters_ready(self) -> None:
        """Unused parameters will get no hook: they are ready now (zeros in their bucket slots)."""
        for index in self.unused_parameters:
            self.mark_variable_ready(index)

    def mark_variable_ready(self, index: int) -> None:
        if index in self.ready_this_iteration:
            name = self.param_names.get(index, "")
            raise RuntimeError(MARKED_TWICE.format(index=index, name=name))
        self.ready_this_iteration.add(index)
        # from now until finalize_backward, the iteration must finish before the next one starts
        self.require_finalize = True
        bucket_index, _ = self.locators[index]
        bucket = self.buckets[bucket_index]
        self.set_divide_factor()
        self.ready_gradient(index)
        bucket.pending -= 1
        if bucket.pending == 0:
            self.mark_bucket_ready(bucket_index)
        if self.next_bucket == len(self.buckets):
            if self.dynamic_graph_find_unused:
                self.all_reduce_local_used_map()
            Variable._execution_engine.queue_callback(self._finalize_at_end_of_backward)

    def set_divide_factor(self) -> None:
        """Gradients are averaged over the group, or over the ranks not yet joined (Join, dynamic mode)."""
        if self.div_factor != UNSET_DIV_FACTOR:
            return
        self.div_factor = dist.get_world_size(self.process_group)
        if self.forward_pass_work is not None and not self.use_static_world_size:
            # the Join context's all-reduce of ones in this iteration's forward counts the active ranks
            self.forward_pass_work.wait()
            self.div_factor = int(self.forward_pass_work.get_future().value()[0].item())

    def grad_of(self, param: torch.Tensor) -> torch.Tensor | None:
        """``param``'s gradient: in the current iteration's distributed autograd context, else ``.grad``."""
        return param.grad if self.rpc_context is None else self.rpc_context.get_grad(param)

    def set_grad(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        if self.rpc_context is None:
            param.grad = grad
        else:
            self.rpc_context.set_grad(param, grad)

    def is_sparse_bucket(self, bucket: Bucket) -> bool:
        return self.expect_sparse[bucket.variable_indices[0]]

    def ready_gradient(self, index: int) -> None:
        """The gradient of ``index``, ready for reduction: into its bucket view, or, sparse, as it is."""
        bucket_index, _ = self.locators[index]
        if not self.expect_sparse[index]:
            self.copy_grad_to_bucket(index)
            return
        grad = self.grad_of(self.params[index])
        # torch's texts (reducer.cpp mark_variable_ready_sparse)
        if grad is None:
            raise RuntimeError("Expected sparse gradient to be defined.")
        if not grad.is_sparse:
            raise RuntimeError("Expected variable to have sparse gradient.")
        if self.comm_hook is None:
            with torch.no_grad():
                grad.div_(self.div_factor)  # in place, as torch: the gradient itself is what is reduced
        self.sparse_grads[bucket_index] = grad

    def copy_grad_to_bucket(self, index: int) -> None:
        """The gradient, divided by the divide factor unless a comm hook divides, into its bucket view."""
        bucket_index, intra = self.locators[index]
        view = self.buckets[bucket_index].views_in[intra]
        param = self.params[index]
        grad = self.grad_of(param)
        with torch.no_grad():
            if grad is None:
                if (self.dynamic_graph_find_unused or self.static_graph_first_iteration) \
                        and int(self.local_used_map[index]) != 0:
                    raise RuntimeError(UNDEFINED_BUT_REDUCED)
                view.zero_()
                return
            if grad.dtype != view.dtype or grad.device != view.device:
                raise RuntimeError(f"Expected {view.dtype} gradient on {view.device} for parameter {index}, "
                                   f"got {grad.dtype} on {grad.device}")
            if grad.shape != view.shape:
                raise RuntimeError(f"Expected gradient of shape {list(view.shape)} for parameter {index}, "
                                   f"got {list(grad.shape)}")
            if shares_storage(grad, view):  # gradient_as_bucket_view: it already lives in the bucket
                if self.comm_hook is None:
                    view.div_(self.div_factor)
                return
            if self.comm_hook is None:
                torch.mul(grad, 1.0 / self.div_factor, out=view)  # divide while copying: one pass
            else:
                view.copy_(grad)
            if self.gradient_as_bucket_view:
                self.set_grad(param, view)

    def mark_bucket_ready(self, bucket_index: int) -> None:
        """Launch buckets strictly in order: a ready bucket waits for every bucket before it."""
        if bucket_index > self.next_bucket:
            return
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self.launch_bucket(self.buckets[self.next_bucket])
            self.next_bucket += 1

    def launch_bucket(self, bucket: Bucket) -> None:
        buffer = self.sparse_grads[bucket.index] if self.is_sparse_bucket(bucket) else bucket.buffer
        bucket.future = self.run_comm_hook(self.grad_bucket(bucket, buffer))

    def grad_bucket(self, bucket: Bucket, buffer: torch.Tensor) -> GradBucket:
        return GradBucket(bucket.index, len(self.buckets), buffer, bucket.offsets, bucket.lengths, bucket.variables)

    def run_comm_hook(self, grad_bucket: GradBucket) -> torch.futures.Future:
        if self.comm_hook is None:
            return allreduce_by_sum(self.process_group, grad_bucket)
        state, hook = self.comm_hook
        future = hook(state, grad_bucket)
        if not isinstance(future, (torch.futures.Future, torch._C.Future)):
            raise RuntimeError(f"DDP comm hook {getattr(hook, '__qualname__', hook)!r} must return a "
                               f"torch.futures.Future of one tensor, got {type(future).__name__}")
        return future

    def all_reduce_local_used_map(self) -> None:
        """Which parameters any rank used: SUM of the int32 local maps, waited for only when needed."""
        self.local_used_map_dev.copy_(self.local_used_map)
        self.local_used_work = dist.all_reduce(self.local_used_map_dev, group=self.process_group, async_op=True)

    # ------------------------------------------------------------ end of backward
    def _finalize_at_end_of_backward(self) -> None:
        with self._lock:
            if self.next_bucket != len(self.buckets):
                raise RuntimeError("reference DDP reducer: finalize ran before every bucket was launched")
            if self.static_graph_after_first_iteration and self.should_rebuild_buckets:
                for index in self.unused_parameters:
                    self.push_rebuilt_param(index)
            self.finalize_backward()

    def finalize_backward(self) -> None:
        """Wait for every bucket, then write the reduced gradients into ``.grad``."""
        self.expect_autograd_hooks = False
        self.require_finalize = False
        for bucket in self.buckets:
            if bucket.future is None:
                raise RuntimeError("Expected bucket.future_work not to be null. This may indicate that "
                                   "communication hook was not properly installed.")
            result = bucket.future.wait()
            if isinstance(result, (list, tuple)) and len(result) == 1:
                result = result[0]
            if not isinstance(result, torch.Tensor):
                raise RuntimeError(f"DDP comm hook future must hold one tensor, got {type(result).__name__}")
            self.div_factor = UNSET_DIV_FACTOR  # Join may change it in the next iteration
            if self.is_sparse_bucket(bucket):
                # the reduced sum replaces the gradient in place (.grad or the context's tensor), as torch's
                # bucket.gradients.copy_(future_result)
                with torch.no_grad():
                    self.sparse_grads.pop(bucket.index).copy_(result)
                continue
            bucket.point_views_out_at(result)
            self.finalize_bucket(bucket)
        if (self.dynamic_graph_find_unused or self.static_graph_first_iteration) and not self.local_used_map_reduced:
            self.local_used_work.wait()  # before the next iteration may reuse local_used_map_dev
        if self.dynamic_graph_find_unused:
            self.local_used_map.zero_()
            self.local_used_map_reduced = False

    def is_globally_unused(self, index: int) -> bool:
        """Unused on every rank: decided lazily, waiting for the used-map all-reduce only if this rank did not use it."""
        if not (self.static_graph or self.find_unused_parameters):
            return False
        if int(self.local_used_map[index]) != 0:
            return False
        if not self.local_used_map_reduced:
            self.local_used_work.wait()
            self.local_used_map.copy_(self.local_used_map_dev)
            self.local_used_map_reduced = True
        return int(self.local_used_map[index]) == 0

    def finalize_bucket(self, bucket: Bucket) -> None:
        with torch.no_grad():
            for intra, (index, param) in enumerate(zip(bucket.variable_indices, bucket.variables)):
                globally_unused = self.is_globally_unused(index)
                view_out = bucket.views_out[intra]
                grad = self.grad_of(param)
                if not self.gradient_as_bucket_view:
                    if globally_unused:
                        continue  # .grad untouched: None stays None
                    if grad is None:  # unused here, used elsewhere: the average arrives anyway
                        self.set_grad(param, clone_obey_contract(view_out, param))
                    else:
                        grad.copy_(view_out)  # in place: get_gradients' tensors stay the same objects
                    continue
                view_in = bucket.views_in[intra]
                if not shares_storage(view_in, view_out):  # a comm hook returned a new tensor
                    view_in.copy_(view_out)
                if globally_unused:
                    continue
                if grad is None:
                    self.set_grad(param, view_in)
                elif not shares_storage(grad, view_in):
                    raise RuntimeError(NOT_A_BUCKET_VIEW)

    # ------------------------------------------------------------ static graph
    def set_static_graph(self) -> None:
        if self.num_iterations != 0:
            raise RuntimeError(STATIC_GRAPH_TOO_LATE)
        self.static_graph = True

    def delay_all_reduce(self) -> None:
        """Static graph, end of iteration 1's backward: reduce everything, remember what went unused."""
        with self._lock:
            self.all_reduce_local_used_map()
            self.unused_parameters = [i for i, count in enumerate(self.hook_counts) if count == 0]
            self.require_finalize = True
            for index in range(len(self.params)):
                self.set_divide_factor()
                self.ready_gradient(index)
            for bucket in self.buckets:
                self.launch_bucket(bucket)
            self.next_bucket = len(self.buckets)
            self.finalize_backward()

    # ------------------------------------------------------------ interfaces for DDP and Join
    def register_comm_hook(self, state, hook) -> None:
        if self.comm_hook is not None:
            raise RuntimeError(HOOK_TWICE)
        self.comm_hook = (state, hook)

    def set_forward_pass_work_handle(self, work, use_static_world_size: bool) -> None:
        self.forward_pass_work = work
        self.use_static_world_size = use_static_world_size

    def get_zeros_like_grad_buckets(self) -> list[GradBucket]:
        """What a joined rank all-reduces to match one backward: every bucket, zeros, in reducer order."""
        return [self.grad_bucket(b, torch.sparse_coo_tensor(size=b.variables[0].shape, dtype=b.buffer.dtype)
                                 if self.is_sparse_bucket(b) else torch.zeros_like(b.buffer)) for b in self.buckets]

    def get_local_used_map(self) -> torch.Tensor:
        """What a joined rank adds to the used-map all-reduce: the device map as it is.

        After training it still holds the last reduced map (as in torch, so a
        parameter used anywhere in the joined rank's last iteration counts as
        used). Before any training it is zeros here; torch 2.13 allocates it
        with at::empty and all-reduces uninitialised memory, so there active
        ranks may see parameters nobody used as used (zero grads, not None).
        """
        return self.local_used_map_dev

    def bucket_indices(self) -> list[list[int]]:
        return [list(b.variable_indices) for b in self.buckets]

    def remove_autograd_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def __del__(self):
        try:
            self.remove_autograd_hooks()
        except Exception:  # interpreter shutdown
            pass


def _hook_for(reducer_ref, index: int):
    def post_accumulate_hook(grad_inputs, grad_outputs):
        reducer = reducer_ref()
        if reducer is not None:
            reducer.autograd_hook(index)

    return post_accumulate_hook
