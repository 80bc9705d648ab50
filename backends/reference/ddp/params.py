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
    """Every rank has as many managed parameters, of the same shapes, as rank 0.

    Checked before the first broadcast: a broadcast of mismatched tensors would
    hang or fail far from the cause. Texts follow torch's
    ``_verify_params_across_processes``.
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
    shapes = torch.tensor([d for p in params for d in (*p.shape, *p.stride())] or [0],
                          dtype=torch.long, device=device)
    rank0 = shapes.clone()
    dist.broadcast(rank0, src=global_rank(process_group, 0), group=process_group)
    if not torch.equal(rank0, shapes):
        mismatched = []
        offset = 0
        for index, p in enumerate(params):
            width = 2 * p.dim()
            if not torch.equal(shapes[offset:offset + width], rank0[offset:offset + width]):
                mismatched.append(f"params[{index}] in this process with sizes {list(p.shape)} "
                                  f"appears not to match sizes of the same param in process 0.")
            offset += width
        raise RuntimeError(f"[{rank}]: " + " ".join(mismatched or ["parameter shapes differ from process 0."]))


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
