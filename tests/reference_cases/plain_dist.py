"""One rank of a 2-process world using the reference backend through plain torch.distributed.

    python -m tests.reference_cases.plain_dist RANK WORLD_SIZE FILESTORE_PATH

Nothing of the suite is used but ``import backends.reference`` (which registers
the backend): init_process_group / all_reduce / broadcast / barrier /
all_gather / send+recv / new_group / destroy_process_group, exactly as a user
would call them. Prints one JSON line of what every call produced; any error
is a traceback and a non-zero exit code.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import backends.reference  # noqa: F401  registers "reference"


def main(rank: int, world_size: int, store_path: str) -> dict:
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("reference", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=30))
    out = {"backend": dist.get_backend(), "rank": dist.get_rank(), "world_size": dist.get_world_size()}

    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out["all_reduce_sum"] = t.tolist()

    t = torch.tensor([rank + 1, 10 * (rank + 1)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t.tolist()

    b = torch.arange(4, dtype=torch.int64) + 100 if rank == world_size - 1 else torch.zeros(4, dtype=torch.int64)
    dist.broadcast(b, src=world_size - 1)
    out["broadcast"] = b.tolist()

    dist.barrier()

    gathered = [torch.zeros(2) for _ in range(world_size)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    out["all_gather"] = [g.tolist() for g in gathered]

    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0]), dst=1, tag=3)
        out["p2p"] = None
    else:
        got = torch.zeros(2)
        dist.recv(got, src=0, tag=3)
        out["p2p"] = got.tolist()

    everyone = dist.new_group(list(range(world_size)))
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, group=everyone)
    out["new_group_all_reduce"] = t.tolist()
    out["new_group_backend"] = dist.get_backend(everyone)

    singletons = [dist.new_group([r]) for r in range(world_size)]  # every rank calls new_group for each
    t = torch.full((1,), float(rank + 5))
    dist.all_reduce(t, group=singletons[rank])
    out["singleton_all_reduce"] = t.tolist()

    dist.barrier(group=everyone)
    dist.destroy_process_group()
    out["initialized_after_destroy"] = dist.is_initialized()
    return out


if __name__ == "__main__":
    result = main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    print("RESULT " + json.dumps(result), flush=True)
