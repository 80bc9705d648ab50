"""``python -m suites.c10d.fault_tolerance_measure [SCENARIO ...]``: what torch 2.14's fault-tolerance API does on gloo.

Run with a torch that has it (``~/.cache/distconform/tox/torch2141/bin/python``). Three ranks (spawned
processes, a FileStore, a 10 s group timeout) run each scenario in a fresh default group made with
``init_process_group("gloo", enable_reconfigure=True)`` (unless the scenario says otherwise) and print one
JSON line per rank and scenario: what each call returned, or its error's first line. The scenarios follow
PyTorch's test/distributed/test_c10d_fault_tolerance.py, plus the error paths its clauses quote
(docs/fault-tolerance.md records the results). Every rank is killed after ``RANK_DEADLINE_S``. Not a clause.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta

WORLD_SIZE = 3
GROUP_TIMEOUT = timedelta(seconds=10)
RANK_DEADLINE_S = 90.0


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _try(found: dict, key: str, call):
    try:
        value = call()
        found[key] = value if isinstance(value, (int, float, str, bool, list, type(None))) else repr(value)
        return value
    except Exception as exc:
        found[key] = _err(exc)
        return None


class Rank:
    """One rank's view of a scenario: its store, its default group, helpers named as PyTorch's test names them."""

    def __init__(self, rank: int, store_path: str, scenario: str):
        import torch.distributed as dist

        self.rank, self.scenario = rank, scenario
        self.store = dist.FileStore(store_path, WORLD_SIZE)

    def init(self, enable_reconfigure: bool = True, backend: str = "gloo"):
        import torch
        import torch.distributed as dist

        kwargs = {"enable_reconfigure": True} if enable_reconfigure else {}
        dist.init_process_group(backend, world_size=WORLD_SIZE, rank=self.rank, store=self.store,
                                timeout=GROUP_TIMEOUT, **kwargs)
        self.backend = dist.get_backend_impl(dist.group.WORLD, torch.device("cpu"))

    def handles(self, key: str) -> list[str]:
        import torch.distributed as dist

        self.store.set(f"{key}_{self.rank}", dist._get_reconfigure_handle())
        return [self.store.get(f"{key}_{r}").decode() for r in range(WORLD_SIZE)]

    def barrier(self, key: str) -> None:
        self.store.set(f"{key}_{self.rank}", "1")
        for r in range(WORLD_SIZE):
            self.store.get(f"{key}_{r}")

    def reconfigure(self, uuid: int, handles: list[str]) -> None:
        import torch.distributed as dist

        dist._reconfigure(uuid, handles, timeout=GROUP_TIMEOUT).wait()

    def summed(self) -> float:
        import torch
        import torch.distributed as dist

        tensor = torch.full((4,), dist.get_rank() + 1.0)
        dist.all_reduce(tensor)
        return tensor[0].item()

    def shape(self) -> list[int]:
        import torch.distributed as dist

        return [dist.get_world_size(), dist.get_rank()]


# ------------------------------------------------------------------ scenarios
def all_handles(r: Rank, found: dict) -> None:
    import torch
    import torch.distributed as dist

    r.init()
    found["supports_reconfigure"] = [dist._supports_reconfigure(), r.backend.supports_reconfigure]
    found["handle_example"] = dist._get_reconfigure_handle()
    _try(found, "all_reduce_before_reconfigure", r.summed)
    r.reconfigure(100, r.handles("all"))
    found["after"] = r.shape()
    found["sum"] = r.summed()
    rank, n = dist.get_rank(), dist.get_world_size()
    send, recv = torch.full((4,), rank + 1.0), torch.zeros(4)
    works = ([r.backend.send([send], (rank + 1) % n, 0), r.backend.recv([recv], (rank - 1) % n, 0)] if rank % 2 == 0
             else [r.backend.recv([recv], (rank - 1) % n, 0), r.backend.send([send], (rank + 1) % n, 0)])
    for work in works:
        work.wait()
    found["ring_recv"] = recv[0].item()
    r.reconfigure(101, r.handles("identity"))
    found["identity_again"] = [*r.shape(), r.summed()]


def shrink(r: Rank, found: dict, excluded: int, uuid: int) -> None:
    import torch
    import torch.distributed as dist

    r.init()
    r.reconfigure(uuid, r.handles(f"shrink{excluded}"))
    handles = r.handles(f"shrink{excluded}_post")
    if r.rank != excluded:
        r.reconfigure(uuid + 1, [h for i, h in enumerate(handles) if i != excluded])
        found["after"] = r.shape()
        found["sum"] = r.summed()
        tensor = torch.full((4,), 42.0) if dist.get_rank() == 0 else torch.zeros(4)
        dist.broadcast(tensor, group_src=0)
        found["broadcast"] = tensor[0].item()
    else:  # the excluded rank: what its group is now
        found["excluded_shape"] = r.shape()
    r.barrier(f"shrink{excluded}_done")


def shrink_last(r: Rank, found: dict) -> None:
    shrink(r, found, WORLD_SIZE - 1, 400)


def shrink_middle(r: Rank, found: dict) -> None:
    shrink(r, found, WORLD_SIZE // 2, 500)


def scale_down_up(r: Rank, found: dict) -> None:
    import torch.distributed as dist

    r.init()
    r.reconfigure(600 + r.rank, [dist._get_reconfigure_handle()])
    found["alone"] = [*r.shape(), r.summed()]
    r.reconfigure(603, r.handles("up"))
    found["back"] = [*r.shape(), r.summed()]


def late_join(r: Rank, found: dict) -> None:
    r.init()
    handles = r.handles("late_initial")
    first = WORLD_SIZE // 2
    if r.rank < first:
        r.reconfigure(900, handles[:first])
        found["early"] = [*r.shape(), r.summed()]
    r.reconfigure(901, r.handles("late_all"))
    found["all"] = [*r.shape(), r.summed()]


def merge(r: Rank, found: dict) -> None:
    r.init()
    handles = r.handles("merge_initial")
    split = WORLD_SIZE // 2
    r.reconfigure(1000 if r.rank < split else 1001, handles[:split] if r.rank < split else handles[split:])
    found["part"] = [*r.shape(), r.summed()]
    r.reconfigure(1002, r.handles("merge_all"))
    found["merged"] = [*r.shape(), r.summed()]


def after_abort(r: Rank, found: dict) -> None:
    r.init()
    r.reconfigure(1200, r.handles("abort_init"))
    found["get_error_before"] = str(r.backend.get_error())
    r.backend.abort()
    found["get_error_after_abort"] = str(r.backend.get_error())
    _try(found, "all_reduce_after_abort", r.summed)
    r.barrier("abort_done")
    r.reconfigure(1201, r.handles("abort_recover"))
    found["recovered"] = [*r.shape(), r.summed()]


def after_timeout(r: Rank, found: dict) -> None:
    import torch
    import torch.distributed as dist

    r.init()
    r.reconfigure(1300, r.handles("timeout_init"))
    r.summed()
    r.backend.set_timeout(timedelta(seconds=2))
    fired = threading.Event()
    _try(found, "register_abort_hook", lambda: r.backend.register_abort_hook(0, fired.set))
    if r.rank != 0:
        started = time.monotonic()
        _try(found, "skipped_all_reduce", lambda: dist.all_reduce(torch.ones(4), async_op=True).wait())
        found["seconds"] = round(time.monotonic() - started, 2)
        found["abort_hook_fired_within_5s"] = fired.wait(5)
        found["get_error_after_timeout"] = str(r.backend.get_error())
        _try(found, "next_all_reduce", lambda: dist.all_reduce(torch.ones(4), async_op=True).wait())
    _try(found, "unregister_abort_hook", lambda: r.backend.unregister_abort_hook(0))
    r.backend.set_timeout(GROUP_TIMEOUT)
    r.barrier("timeout_observed")
    r.reconfigure(1301, r.handles("timeout_recover"))
    found["recovered"] = [*r.shape(), r.summed()]


def reused_uuid(r: Rank, found: dict) -> None:
    import torch.distributed as dist

    r.init()
    r.reconfigure(1100 + r.rank, [dist._get_reconfigure_handle()])
    _try(found, "again", lambda: r.reconfigure(1100 + r.rank, [dist._get_reconfigure_handle()]))
    # the same uuid by another group: rank 1 and 2 reuse rank 0's
    r.barrier("reused_mid")
    _try(found, "same_handles_twice", lambda: r.reconfigure(1150 + r.rank, [dist._get_reconfigure_handle()] * 2))
    _try(found, "no_handles", lambda: r.reconfigure(1160 + r.rank, []))
    r.barrier("reused_done")


def refusals_after_reconfigure(r: Rank, found: dict) -> None:
    """The refusals with the handles a reconfigured group gives (a reconfigure may change them)."""
    r.init()
    r.reconfigure(1100, r.handles("refusals"))
    handles = r.handles("refusals_post")
    others = [h for i, h in enumerate(handles) if i != r.rank]
    for name, uuid, peers in (("own_handle_missing", 1103, others), ("a_handle_twice", 1102, handles + handles[:1]),
                              ("no_handles", 1101, []), ("reused_uuid", 1100, handles)):
        print(f"rank {r.rank}: {name}", file=sys.stderr, flush=True)
        _try(found, name, lambda: r.reconfigure(uuid, peers))
    found["after"] = _try(found, "facts", lambda: [*r.shape(), r.summed()])


def not_member(r: Rank, found: dict) -> None:
    r.init()
    handles = r.handles("not_member")
    others = [h for i, h in enumerate(handles) if i != r.rank]
    _try(found, "own_handle_missing", lambda: r.reconfigure(1400 + r.rank, others[:1]))
    found["after"] = _try(found, "shape", r.shape)
    r.barrier("not_member_done")


def without_enable(r: Rank, found: dict) -> None:
    import torch.distributed as dist

    r.init(enable_reconfigure=False)
    _try(found, "supports_reconfigure", dist._supports_reconfigure)
    _try(found, "backend_supports_reconfigure", lambda: r.backend.supports_reconfigure)
    _try(found, "enable_reconfigure_option", lambda: r.backend.options.enable_reconfigure)
    _try(found, "get_reconfigure_handle", dist._get_reconfigure_handle)
    _try(found, "reconfigure", lambda: r.reconfigure(1500 + r.rank, [dist._get_reconfigure_handle()]))
    _try(found, "get_error", lambda: str(r.backend.get_error()))
    _try(found, "sum", r.summed)
    r.barrier("without_done")


def enabled_options(r: Rank, found: dict) -> None:
    r.init()
    _try(found, "enable_reconfigure_option", lambda: r.backend.options.enable_reconfigure)
    r.barrier("enabled_done")


def hooks(r: Rank, found: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import HookOpName

    r.init(enable_reconfigure=False)
    seen: list = []
    pg = dist.group.WORLD

    def pre(args):
        seen.append(["pre", str(args.name), args.op_id, args.async_op, args.root, len(args.input_tensors),
                     len(args.output_tensors)])

    def post(args):
        seen.append(["post", str(args.name), args.op_id, args.async_op, args.work is not None])

    _try(found, "register_pre_hook", lambda: pg.register_pre_hook(1, pre))
    _try(found, "register_post_hook", lambda: pg.register_post_hook(1, post))
    _try(found, "register_pre_hook_same_id", lambda: pg.register_pre_hook(1, pre))
    r.summed()
    dist.broadcast(torch.zeros(2), src=1)
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    dist.barrier()
    if r.rank == 0:
        dist.send(torch.ones(1), 1)
    elif r.rank == 1:
        dist.recv(torch.zeros(1), 0)
    found["seen"] = seen[:]
    _try(found, "unregister_pre_hook", lambda: pg.unregister_pre_hook(1))
    _try(found, "unregister_missing", lambda: pg.unregister_pre_hook(99))
    _try(found, "unregister_post_hook", lambda: pg.unregister_post_hook(1))
    count = len(seen)
    r.summed()
    found["after_unregister"] = len(seen) - count
    found["op_names"] = list(HookOpName.__members__)
    _try(found, "gloo_register_abort_hook", lambda: r.backend.register_abort_hook(3, lambda: None))
    _try(found, "gloo_unregister_abort_hook", lambda: r.backend.unregister_abort_hook(3))
    _try(found, "gloo_unregister_unknown", lambda: r.backend.unregister_abort_hook(77))
    _try(found, "has_hooks", lambda: pg._has_hooks())
    r.barrier("hooks_done")


def py_backend(r: Rank, found: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend

    class Mine(Backend):
        def __init__(self, rank, size):
            super().__init__(rank, size)

        def allreduce(self, tensors, opts=None):
            for t in tensors:
                t.mul_(10)
            fut = torch.futures.Future()
            fut.set_result(tensors)
            return torch._C._distributed_c10d._create_work_from_future(fut)

    mine = _try(found, "construct", lambda: Mine(r.rank, WORLD_SIZE))
    if mine is not None:
        found["rank_size"] = [mine.rank(), mine.size()]
        _try(found, "name", mine.name)
        _try(found, "get_error", lambda: str(mine.get_error()))
        _try(found, "register_abort_hook", lambda: mine.register_abort_hook(0, lambda: None))
        _try(found, "supports_reconfigure", lambda: mine.supports_reconfigure)

    def create(opts, backend_options):
        return Mine(opts.group_rank, opts.group_size)

    dist.Backend.register_backend("mine", create, extended_api=True, devices=["cpu"])
    r.init(enable_reconfigure=False, backend="cpu:mine")
    _try(found, "get_backend", lambda: dist.get_backend())
    _try(found, "impl_type", lambda: type(dist.get_backend_impl(dist.group.WORLD, torch.device("cpu"))).__name__)
    tensor = torch.ones(2)
    _try(found, "all_reduce", lambda: dist.all_reduce(tensor))
    found["value"] = tensor[0].item()
    r.barrier("py_backend_done")


def mixed_string(r: Rank, found: dict) -> None:
    """Rank 0 alone: which backend serves each device of a mixed string, for a Python ProcessGroup ("whole"),
    for a Python Backend subclass ("mine"), and for the reference (a Backend there from torch 2.14 on)."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend

    if r.rank != 0:
        return
    import backends.reference  # noqa: F401  (registers "reference")

    def finished(tensors):
        fut = torch.futures.Future()
        fut.set_result(tensors)
        return torch._C._distributed_c10d._create_work_from_future(fut)

    class Mine(Backend):
        def getBackendName(self):
            return "mine"

        def allreduce(self, tensors, opts=None):
            for t in tensors:
                t.mul_(10)
            return finished(tensors)

    class Whole(dist.ProcessGroup):
        def getBackendName(self):
            return "whole"

        def allreduce(self, tensors, opts=None):
            for t in tensors:
                t.mul_(100)
            return finished(tensors)

    dist.Backend.register_backend("mine", lambda opts, _: Mine(opts.group_rank, opts.group_size), extended_api=True,
                                  devices=["cpu"])
    dist.Backend.register_backend("whole", lambda opts, _: Whole(opts.group_rank, opts.group_size),
                                  extended_api=True, devices=["cpu"])
    for text in ("cpu:whole,cuda:gloo", "cpu:mine,cuda:gloo", "cpu:reference,cuda:gloo"):
        seen: dict = {}
        store = dist.HashStore()
        dist.init_process_group(text, store=store, rank=0, world_size=1, timeout=GROUP_TIMEOUT)
        seen["get_backend"] = dist.get_backend()
        seen["group_type"] = type(dist.group.WORLD).__name__
        for device in ("cpu", "cuda"):
            _try(seen, f"impl_{device}",
                 lambda: type(dist.get_backend_impl(dist.group.WORLD, torch.device(device))).__name__)
        tensor = torch.ones(1)
        _try(seen, "cpu_all_reduce", lambda: dist.all_reduce(tensor))
        seen["cpu_value"] = tensor.item()
        dist.destroy_process_group()
        found[text] = seen


def multi_backend(r: Rank, found: dict) -> None:
    import torch
    import torch.distributed as dist

    if r.rank != 0:
        return
    pg = dist.ProcessGroup(0, 1)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL)
    _try(found, "supports_reconfigure", lambda: pg.supports_reconfigure)
    _try(found, "get_reconfigure_handle", pg.get_reconfigure_handle)
    _try(found, "reconfigure", lambda: pg.reconfigure(dist.distributed_c10d.ReconfigureOptions()))


SCENARIOS = {f.__name__: f for f in (all_handles, shrink_last, shrink_middle, scale_down_up, late_join, merge,
                                     after_abort, after_timeout, reused_uuid, refusals_after_reconfigure, not_member, without_enable,
                                     enabled_options, hooks, py_backend, mixed_string, multi_backend)}


def _rank(rank: int, store_path: str, scenario: str, out) -> None:
    import torch.distributed as dist

    found: dict = {}
    try:
        SCENARIOS[scenario](Rank(rank, store_path, scenario), found)
    except Exception as exc:
        found["raised"] = _err(exc)
        found["where"] = traceback.format_exc().splitlines()[-3].strip()
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:
                found["destroy"] = _err(exc)
    out.put((rank, found))


def run(scenario: str) -> dict:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [context.Process(target=_rank, args=(rank, path, scenario, out)) for rank in range(WORLD_SIZE)]
        for proc in procs:
            proc.start()
        found: dict = {}
        end = time.monotonic() + RANK_DEADLINE_S
        while len(found) < WORLD_SIZE and time.monotonic() < end:
            try:
                rank, result = out.get(timeout=1)
                found[rank] = result
            except Exception:
                pass
        for proc in procs:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
        for rank in range(WORLD_SIZE):
            found.setdefault(rank, {"hung": f"no result within {RANK_DEADLINE_S} s"})
    return found


def main(argv: list[str]) -> None:
    import torch

    print(json.dumps({"torch": torch.__version__}))
    for scenario in argv or list(SCENARIOS):
        started = time.monotonic()
        found = run(scenario)
        print(json.dumps({"scenario": scenario, "seconds": round(time.monotonic() - started, 1),
                          **{str(k): v for k, v in sorted(found.items())}}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
