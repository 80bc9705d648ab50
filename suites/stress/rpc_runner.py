"""The RPC benchmark's sweep, on the controller: a World per (backend, world size), each agent started in its
ranks in turn, every (benchmark, mode, profiled) of the plan measured there (what the ranks run:
rpc_bench.py, rpc_train.py), and a failure turned into an error row before the sweep goes on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import weakref

from backends import rpc_agents
from suites.stress.common import WorldSlot, device_plan, say
from suites.stress.progress import Progress
from suites.stress.records import RpcKey, RpcRecord
from suites.stress.rpc_figures import best_of
from suites.stress.rpc_options import calls_of, plan
from suites.stress.rpc_tables import progress_line

IMPORT_DEADLINE_S = 180.0  # importing a training stack (torch.distributed.optim) is slow on a loaded machine


class RpcBench:
    """Runs every agent in every (backend, world size) world and collects records and errors."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.records: list[RpcRecord] = []
        self.errors: list[dict] = []
        self.unavailable: list[dict] = []
        self._init_dir = tempfile.mkdtemp(prefix="distconform-rpc-stress-")
        self._starts = 0
        self._started: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # World -> agents started in its processes
        self.progress = Progress(0, enabled=False)  # run() makes the real one (a terminal only)

    # -------------------------------------------------------------- errors
    def _error(self, key: dict, stage: str, exc: BaseException, skipped=()) -> None:
        text = str(exc) or repr(exc)
        lines = [line for line in text.splitlines() if line.strip()]
        first = lines[0] if lines else type(exc).__name__
        if first.endswith(":") and len(lines) > 1:  # "measure raised on ranks [...]:" + the first rank's error
            first += " " + lines[1].strip()
        entry = dict(key, stage=stage, error=f"{type(exc).__name__}: {first}", detail=text[:50000])
        if skipped:
            entry["not_run"] = [f"{b} {m}{' profiled' if p else ''}" for b, m, p in skipped]
        self.errors.append(entry)
        where = f"{key.get('benchmark', '')} {key.get('mode', '')}{' profiled' if key.get('profiled') else ''}"
        say(f"# ERROR {key['agent']} {key['backend']} ws{key['world_size']} {stage} {where.strip()}: {entry['error']}")
        if entry.get("not_run"):
            say(f"#   not run: {', '.join(entry['not_run'])}")
        if "\n" in text:
            say("#   (the full message, with every rank's stack or traceback, is in stress.json under errors)")

    # ---------------------------------------------------------------- run
    def usable_agents(self) -> list[str]:
        usable = []
        for name in self.args.agents:
            availability = rpc_agents.get(name).availability()
            reason = availability.reason
            if availability.available and not callable(getattr(rpc_agents.api(name), "init_rpc", None)):
                reason = f"{rpc_agents.get(name).module} has no init_rpc yet"
            if availability.available and not reason:
                usable.append(name)
                continue
            self.unavailable.append({"agent": name, "backend": None, "world_size": None, "reason": reason})
            say(f"# agent {name}: unavailable, skipped: {reason}")
        return usable

    def run(self, registry) -> None:
        agents = self.usable_agents()
        args = self.args
        self.progress = Progress(len(agents) * len(args.backends) * len(args.world_sizes) * len(plan(args)))
        with self.progress:
            self._sweep(registry, agents)

    def _sweep(self, registry, agents) -> None:
        steps_per_world = len(agents) * len(plan(self.args))
        try:
            for backend in self.args.backends:
                spec = registry.get(backend)
                availability = spec.availability()
                if not availability.available:
                    self.unavailable.append({"agent": None, "backend": backend, "world_size": None,
                                             "reason": availability.reason})
                    say(f"# backend {backend}: unavailable, skipped: {availability.reason}")
                    self.progress.skip(steps_per_world * len(self.args.world_sizes))
                    continue
                for world_size in self.args.world_sizes:
                    devices = device_plan(spec, world_size)
                    if isinstance(devices, str):
                        self.unavailable.append({"agent": None, "backend": backend, "world_size": world_size,
                                                 "reason": devices})
                        say(f"# backend {backend} world_size={world_size}: unavailable, skipped: {devices}")
                        self.progress.skip(steps_per_world)
                        continue
                    slot = WorldSlot(spec, world_size, devices, plugins=self.args.backend_plugin,
                                     deadline=self.args.deadline)
                    try:
                        for agent in agents:
                            self._run_agent(slot, agent, backend, world_size)
                    finally:
                        slot.close()
        finally:
            shutil.rmtree(self._init_dir, ignore_errors=True)

    def _start(self, slot: WorldSlot, key: RpcKey, remaining) -> bool:
        from suites.stress import rpc_bench

        try:
            world = slot.get()
            if key.agent in self._started.get(world, ()) and rpc_agents.get(key.agent).one_start_per_process:
                world.kill()  # a second start in these processes would not be a clean agent (rpc_agents.py)
                world = slot.get()
        except Exception as exc:
            self._error(key.to_json(), "world start", exc, remaining)
            return False
        self._started.setdefault(world, set()).add(key.agent)
        self._starts += 1
        init_file = os.path.join(self._init_dir, f"init-{self._starts}")
        try:
            world.run(rpc_bench.start, key.agent, init_file, self.args.rpc_timeout, self.args.num_worker_threads,
                      deadline=self.args.deadline)
        except Exception as exc:
            self._error(key.to_json(), "agent start", exc, remaining)
            self._abandon(slot, key.agent)
            return False
        return True

    def _abandon(self, slot: WorldSlot, agent: str) -> None:
        """After a failure: stop the agent without the handshake, or kill the world if even that fails."""
        from suites.stress import rpc_bench

        world = slot.world
        if world is None or not world.alive:
            return  # the world was killed (hang, dead rank): the agent went with it
        try:
            world.run(rpc_bench.stop, agent, False, deadline=min(self.args.deadline, 20.0))
        except Exception:
            world.kill()

    def _run_agent(self, slot: WorldSlot, agent: str, backend: str, world_size: int) -> None:
        from suites.stress import rpc_bench, rpc_train

        args = self.args
        steps = plan(args)
        running = False
        for index, (benchmark, mode, profiled) in enumerate(steps):
            key = RpcKey(agent, backend, world_size, benchmark, mode, profiled)
            self.progress.start(key.describe())
            if not running:
                if not self._start(slot, key, steps[index:]):
                    self.progress.skip(len(steps) - index)
                    return  # an agent that cannot start is one error, not one per measurement
                running = True
            calls = calls_of(args, benchmark)
            udf = args.planted.get(agent) if benchmark == "light" else None
            world = slot.world
            assert world is not None  # _start made it (or the agent was abandoned above)
            started = time.monotonic()
            try:
                if benchmark == "train":
                    world.run(rpc_train.prepare, agent, deadline=max(args.deadline, IMPORT_DEADLINE_S))
                    runs = [world.run(rpc_train.measure, agent, steps=calls, warmup=args.warmup,
                                      deadline=args.deadline) for _ in range(args.repeat)]
                else:
                    runs = [world.run(rpc_bench.measure, agent, benchmark, mode, calls=calls,
                                      warmup=args.warmup, profiled=profiled, udf=udf, deadline=args.deadline)
                            for _ in range(args.repeat)]
            except Exception as exc:
                # RankError (an RPC failed), DeadlineExceeded (a hang: stacks in the JSON),
                # RankDied: this measurement is an error row; the agent is stopped (or the
                # world replaced) and started afresh for the next one.
                self._error(key.to_json(), "measure", exc)
                self._abandon(slot, agent)
                running = False
                self.progress.step()
                continue
            self.progress.step()
            record = best_of(key, calls, runs, wall_s=time.monotonic() - started)
            self.records.append(record)
            say(progress_line(record))
        if running and slot.world is not None:
            try:
                slot.world.run(rpc_bench.stop, agent, True, deadline=args.deadline)
            except Exception as exc:
                stopping = {"agent": agent, "backend": backend, "world_size": world_size, "benchmark": None,
                            "mode": None, "profiled": None}  # an error of the agent, not of a measurement
                self._error(stopping, "agent stop", exc)
                self._abandon(slot, agent)
