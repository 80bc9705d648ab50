"""What a rank process holds, read from /proc and /dev/shm, and waiting for it to settle back to a baseline.

One reading is a ``Holding``: descriptors (/proc/self/fd), OS threads (/proc/self/task), listening TCP
ports owned by this process's sockets (/proc/net/tcp*, state LISTEN), the /dev/shm entries it maps or
holds open, and the resident set size. The soak clauses compare readings before and after groups live and die.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import asdict, dataclass, fields

LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket
COUNTED = ("fds", "threads", "listening_ports", "shm_entries")  # what must return to the baseline exactly


@dataclass(frozen=True)
class Holding:
    fds: int
    threads: int
    listening_ports: int
    shm_entries: int
    rss_kib: int

    def minus(self, other: Holding) -> dict[str, int]:
        return {f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def descriptor_targets() -> list[str]:
    """What each open descriptor of this process points at (/proc/self/fd/N's link)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the descriptor listdir itself used, or one closed meanwhile
    return targets


def socket_inodes(targets: list[str] | None = None) -> set[str]:
    """The inodes of this process's sockets (of ``targets``, else read now)."""
    return {t[len("socket:["):-1] for t in (descriptor_targets() if targets is None else targets)
            if t.startswith("socket:[")}


def listening_ports(inodes: set[str]) -> int:
    """The TCP sockets among ``inodes`` that listen (/proc/net/tcp and tcp6, state LISTEN)."""
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        count += sum(1 for row in rows if row.split()[3] == LISTEN and row.split()[9] in inodes)
    return count


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _shm_entries() -> int:
    """Distinct /dev/shm entries this process maps or holds open (not the host's: other processes make
    and remove their own meanwhile)."""
    held = set()
    with open("/proc/self/maps") as fh:
        held.update(line.split(None, 5)[5].strip() for line in fh if "/dev/shm/" in line)
    held.update(t for t in descriptor_targets() if t.startswith("/dev/shm/"))
    return len(held)


def holding() -> Holding:
    """What this process holds now."""
    fds = len(os.listdir("/proc/self/fd")) - 1  # minus the descriptor listdir opened to read the folder
    return Holding(fds=fds, threads=len(os.listdir("/proc/self/task")),
                   listening_ports=listening_ports(socket_inodes()), shm_entries=_shm_entries(),
                   rss_kib=_rss_kib())


def leftovers(baseline: Holding, now: Holding) -> dict[str, tuple[int, int]]:
    """The counted resources that exceed the baseline: name -> (baseline, now)."""
    return {name: (getattr(baseline, name), getattr(now, name)) for name in COUNTED
            if getattr(now, name) > getattr(baseline, name)}


def settle(baseline: Holding | None, grace_s: float) -> Holding:
    """A reading after gc.collect(), waiting up to ``grace_s`` for destroyed groups' threads and sockets to go.

    With a baseline: until nothing counted exceeds it. Without one: until two readings 0.2 s apart agree."""
    end = time.monotonic() + grace_s
    previous = None
    while True:
        gc.collect()
        now = holding()
        if baseline is not None and not leftovers(baseline, now):
            return now
        if baseline is None and previous is not None and all(
                getattr(now, n) == getattr(previous, n) for n in COUNTED):
            return now
        if time.monotonic() > end:
            return now
        previous = now
        time.sleep(0.2 if baseline is None else 0.05)
