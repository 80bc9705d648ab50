"""``python -m tests.harness_cases.zygote_probe``: a world of gloo at world size 2 from this process's zygote, started
as pytest_configure starts it (fixtures/pool.py ``warm_up``); prints one JSON line of what the tests check
(tests/test_world.py): which kind of zygote it was, the ranks' and the zygote's titles and session tags, a result
computed across the ranks, and which of these processes outlived ``close()``."""

from __future__ import annotations

import json
import os

import torch  # noqa: F401  (as in a pytest process: the controller has torch imported when it starts its zygote)

from backends.registry import BackendRegistry
from fixtures.spawner import Zygote
from fixtures.world import World
from tests.harness_cases import rank_fns
from tests.harness_cases.procs import alive_of, command_line, rank_processes, session_of, session_processes


def main() -> None:
    held = open(os.devnull)  # noqa: SIM115  (a descriptor of the controller's the zygote must not hold)
    Zygote.warm_up(before_any_test=True)
    zygote = Zygote.get()
    world = World(BackendRegistry().get("gloo"), 2, ("cpu", "cpu")).start()
    try:
        pids = [r["pid"] for r in world.run(rank_fns.whoami, "probe")]
        found = {
            "fresh_because": zygote.fresh_because,
            "zygote_parent": int(open(f"/proc/{zygote.proc.pid}/stat").read().rsplit(")", 1)[1].split()[1]),
            "zygote_title": command_line(zygote.proc.pid),
            "zygote_fds": sorted(int(fd) for fd in os.listdir(f"/proc/{zygote.proc.pid}/fd")),
            "rank_titles": [command_line(pid) for pid in pids],
            "rank_stdin": [os.readlink(f"/proc/{pid}/fd/0") if os.path.exists(f"/proc/{pid}/fd/0") else None
                           for pid in pids],
            "rank_sessions": [session_of(pid) for pid in pids],
            "session": world.session_tag,
            "ranks_found": sorted(rank_processes(world.session_tag)),
            "session_found": sorted(session_processes(world.session_tag)),
            "pids": pids,
            "zygote": zygote.proc.pid,
            "sum": world.run(rank_fns.all_reduce_rank_sum),
        }
    finally:
        world.close()
    found["outlived_close"] = alive_of(pids)
    zygote.stop()
    found["zygote_outlived_stop"] = alive_of([found["zygote"]])
    found["me"] = os.getpid()
    found["held_fd"] = held.fileno()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
