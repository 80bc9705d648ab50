"""Which tensors DDP manages, and how the ranks agree on them at construction.

DDP reduces the gradients of *managed parameters* and broadcasts *buffers*.
The rules (torch 2.13, ``DistributedDataParallel._build_params_for_reducer``):

* walk ``module.named_modules()`` and each module's
  ``named_parameters(recurse=False)``; keep parameters that require grad and
  whose name ``"{module_name}.{param_name}"`` is not in
  ``module._ddp_params_and_buffers_to_ignore``. Note the root module's own
  parameters are named ``".weight"`` there (``module_name`` is ``""``), so an
  ignore list must name a root parameter ``".weight"`` to hit it in this walk;
  the broadcast at construction and the buffer names use ``named_parameters()``
  / ``named_buffers()`` names (``"weight"``). That is torch's behaviour.
* de-duplicate by identity, first occurrence wins. A parameter registered in
  two modules (``net1.bias = self.bias``) is one tensor with one
  AccumulateGrad; managing it twice made its gradient hook fire for one index
  only and left the other one forever pending (PyTorch issue 41324).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

IGNORE_ATTRIBUTE = "_ddp_params_and_buffers_to_ignore"

NO_TRAINABLE_PARAMETERS = (
    "DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient."
)


def names_to_ignore(module: torch.nn.Module) -> set[str]:
    """The names DDP leaves alone, from the module attribute torch's DDP reads."""
    return set(getattr(module, IGNORE_ATTRIBUTE, ()))


def set_params_and_buffers_to_ignore(module: torch.nn.Module, names) -> None:
    """What ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model`` does."""
    setattr(module, IGNORE_ATTRIBUTE, names)
    for name, param in module.named_parameters():
        if name in names:
            param._ddp_ignored = True
    for name, buffer in module.named_buffers():
        if name in names:
            buffer._ddp_ignored = True


def managed_parameters(module: torch.nn.Module, ignore: set[str]) -> tuple[list, list[bool], dict[int, str]]:
    """(parameters, expect_sparse_gradient, index -> fully qualified name), in managed-index order."""
    modules_and_params = []
    seen: set[int] = set()
    for module_name, submodule in module.named_modules():
        for param_name, param in submodule.named_parameters(recurse=False):
            if not param.requires_grad or f"{module_name}.{param_name}" in ignore:
                continue
            if id(param) in seen:  # shared parameter: managed once (issue 41324)
                continue
            seen.add(id(param))
            modules_and_params.append((submodule, f"{module_name}.{param_name}", param))
    params = [p for _, _, p in modules_and_params]
    sparse = [bool(isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse)
              for m, _, _ in modules_and_params]
    names = {i: name for i, (_, name, _) in enumerate(modules_and_params)}
    return params, sparse, names


def buffers_to_sync(module: torch.nn.Module, ignore: set[str]) -> dict[str, torch.Tensor]:
    """Buffers broadcast before each forward (re-read every time: a module may reassign them)."""
    return {name: buf for name, buf in module.named_buffers() if name not in ignore}


def verify_same_model(process_group, params: list[torch.Tensor]) -> None:
    """Every rank has as many managed parameters as every other, of rank 0's sizes and strides.

    Checked before the first broadcast: a broadcast of mismatched tensors would
    hang or fail far from the cause. The texts are torch's
    (``_verify_params_across_processes``). One deliberate difference: torch
    raises the size/stride error only on the mismatching ranks and leaves the
    others waiting in the first broadcast (a hang until the group timeout);
    here every rank learns the shapes of all and raises at once.
    """
    device = params[0].device
    world_size = dist.get_world_size(process_group)
    rank = dist.get_rank(process_group)
    count = torch.tensor([len(params)], dtype=torch.long, device=device)
    counts = [torch.empty_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count, group=process_group)
    for other, their_count in enumerate(counts):
        if int(their_count.item()) != len(params):
            raise RuntimeError(
                f"DDP expects same model across all ranks, but Rank {rank} has {len(params)} params, "
                f"while rank {other} has inconsistent {int(their_count.item())} params.")
    # per parameter: number of dims, sizes, strides (lengths may differ between ranks: pad with -1)
    layout = [v for p in params for v in (p.dim(), *p.shape, *p.stride())]
    length = torch.tensor([len(layout)], dtype=torch.long, device=device)
    lengths = [torch.empty_like(length) for _ in range(world_size)]
    dist.all_gather(lengths, length, group=process_group)
    longest = max(int(n.item()) for n in lengths)
    mine = torch.full((longest,), -1, dtype=torch.long, device=device)
    mine[:len(layout)] = torch.tensor(layout, dtype=torch.long)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine, group=process_group)
    rank0 = everyone[0].cpu().tolist()
    mismatched = [r for r, theirs in enumerate(everyone) if not torch.equal(theirs, everyone[0])]
    if not mismatched:
        return
    if rank in mismatched:
        position = 0
        for index, p in enumerate(params):
            dims = p.dim()
            their_sizes = rank0[position + 1:position + 1 + dims]
            their_strides = rank0[position + 1 + dims:position + 1 + 2 * dims]
            if rank0[position] != dims or their_sizes != list(p.shape):
                raise RuntimeError(f"[{rank}]: params[{index}] in this process with sizes {list(p.shape)} "
                                   "appears not to match sizes of the same param in process 0.")
            if their_strides != list(p.stride()):
                raise RuntimeError(f"[{rank}]: params[{index}] in this process with strides {list(p.stride())} "
                                   "appears not to match strides of the same param in process 0.")
            position += 1 + 2 * dims
    raise RuntimeError(f"[{rank}]: DDP expects same model across all ranks, but the parameters of rank(s) "
                       f"{mismatched} do not match the sizes or strides of process 0's (their errors say which).")


def global_rank(process_group, group_rank: int) -> int:
    """The global rank of ``group_rank`` (torch.distributed's functions take global ranks)."""
    if process_group is None or process_group is dist.GroupMember.WORLD:
        return group_rank
    return dist.get_global_rank(process_group, group_rank)


def broadcast_coalesced(process_group, tensors: list[torch.Tensor], src: int) -> None:
    """Broadcast ``tensors`` from group rank ``src``, one flat message per (dtype, device).

    What ``dist._broadcast_coalesced`` does, written with the public API so it
    runs over any process group (a Python ProcessGroup included).
    """
    if not tensors:
        return
    src_global = global_rank(process_group, src)
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for same_kind in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in same_kind])
            dist.broadcast(flat, src=src_global, group=process_group)
            offset = 0
            for t in same_kind:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()


def sync_module_states(module, process_group, src: int, ignore: set[str], broadcast_buffers: bool) -> None:
    """Parameters (and buffers) of group rank ``src`` on every rank: DDP's init and final sync."""
    tensors = [p.detach() for name, p in module.named_parameters() if name not in ignore]
    if broadcast_buffers:
        tensors += [b.detach() for name, b in module.named_buffers() if name not in ignore]
    broadcast_coalesced(process_group, tensors, src)
