"""Rank-side functions of tests/harness_cases/launch_cases.py (importable by launched ranks)."""

from __future__ import annotations

import ipaddress
import os
import signal
import time

import torch
import torch.distributed as dist

from fixtures.launch.env import hostname
from fixtures.rank import ctx


def where() -> dict:
    assert ctx.config is not None
    return {"rank": ctx.rank, "host": hostname(), "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
            "device": ctx.device, "world_size": ctx.world_size, "store_host": ctx.config.store[0],
            # the level torch runs at in this rank, and the variable it was read from
            "debug_level": dist.get_debug_level().name, "debug_env": os.environ.get("TORCH_DISTRIBUTED_DEBUG")}


ESTABLISHED = "01"  # the state column of /proc/net/tcp


def _address(hex_address: str) -> str:
    """/proc/net/tcp's ``0100007F`` (IPv4) or 32 hex digits (IPv6, four host-order words) -> the dotted text;
    an IPv4-mapped IPv6 address (a dual-stack socket's peer) as its IPv4 address."""
    raw = bytes.fromhex(hex_address)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is little-endian
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def tcp_connections() -> list[tuple[str, str]]:
    """(local address, remote address) of every established TCP connection of this rank process, after a
    collective on the default group (gloo's pairs exist by then): where its traffic really goes."""
    dist.all_reduce(torch.ones(1))
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):  # this process's network namespace
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == ESTABLISHED and fields[9] in inodes:
                    found.append((_address(fields[1].split(":")[0]), _address(fields[2].split(":")[0])))
    return sorted(found)


def all_reduce_rank_sum() -> float:
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return t.item()


def last_rank_of_node1_sleeps_in_python() -> None:
    """The last rank (on the simulated node1) never enters the collective; the others wait in it."""
    if ctx.rank == ctx.world_size - 1:
        while True:
            time.sleep(0.05)  # marker: last_rank_of_node1_sleeps_in_python
    dist.barrier()


def last_rank_of_node1_exits_7() -> None:
    if ctx.rank == ctx.world_size - 1:
        os._exit(7)
    dist.barrier()


def last_rank_of_node1_exits_7_on_the_first_attempt() -> None:
    """As last_rank_of_node1_exits_7 while torchrun has not restarted the workers; a no-op barrier after."""
    if ctx.rank == ctx.world_size - 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os._exit(7)
    dist.barrier()


def the_controller_is_killed_on_the_first_attempt() -> None:
    """Rank 0's parent is the controller (pytest): SIGKILLed mid-case, before any outcome is journalled."""
    if ctx.rank == 0 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
    dist.barrier()


def a_node_stops() -> None:
    """The ranks of node $STOP_NODE ask the test to SIGSTOP their whole node (file $STOP_REQUEST), then
    wait to be stopped; the others wait in a barrier. Nothing closes a connection: only the silence tells."""
    if hostname() == os.environ["STOP_NODE"]:
        with open(os.environ["STOP_REQUEST"], "a") as fh:
            fh.write(f"{ctx.rank}\n")
        time.sleep(600)
    dist.barrier()


def node1_is_lost() -> None:
    """Every launched process of node1 is SIGKILLed (its ranks die with them): a lost node."""
    if hostname() == "node1":
        os.kill(os.getppid(), signal.SIGKILL)  # the supervisor, i.e. the launcher's worker
        time.sleep(60)
    dist.barrier()


def node1_is_cut_off() -> None:
    """The ranks of node1 ask the test to partition their host (file $PARTITION_REQUEST) and wait until it is
    (file $PARTITION_DONE); then every rank enters an all_reduce, whose bytes between the nodes vanish on the
    bridge (those between node1's own ranks stay inside its host)."""
    if hostname() == "node1":
        with open(os.environ["PARTITION_REQUEST"], "a") as fh:
            fh.write(f"{ctx.rank}\n")
        while not os.path.exists(os.environ["PARTITION_DONE"]):
            time.sleep(0.05)
    dist.all_reduce(torch.ones(1))
