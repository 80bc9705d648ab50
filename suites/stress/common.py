"""What the stress benchmarks (collectives.py, rpc.py) share: option lists, output, host facts,
and a World per backend that is there when a measurement needs it.

A benchmark must go on after a failure: a rank error taints the world (it is
reset: fresh process groups in the same processes), a hang or a dead rank
kills it (the next use starts a new one). ``WorldSlot`` does exactly that, so
each benchmark only says what to measure.
"""

from __future__ import annotations

import os
import platform
import sys


def csv_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c'] (the comma-separated options)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def say(text: str = "") -> None:
    from suites.stress.progress import clear_line

    clear_line()  # a terminal's progress line (progress.py) never mixes into the output
    print(text, flush=True)


def host_info() -> dict:
    """The machine a figure was measured on (for reports and baselines)."""
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "platform": platform.platform()}
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as fh:
            models = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        if models:
            info["cpu_model"] = models[0]
    except OSError:
        pass
    return info


def backend_registry(plugins, backends):
    """The backend registry with ``plugins`` loaded and every name in ``backends`` known;
    None after printing the usage error (the caller exits 2). Zygote warmed up when it succeeds."""
    from backends.registry import BackendRegistry, PluginImportError, UnknownBackend
    from fixtures.spawner import Zygote

    try:
        registry = BackendRegistry(plugins)
        for name in backends:
            registry.get(name)
    except (UnknownBackend, PluginImportError) as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return None
    Zygote.warm_up(before_any_test=True)  # nothing has run here but argument parsing and the registry
    return registry


def run_until_interrupted(run, *args) -> None:
    """Run the sweep; Ctrl-C ends it early and the caller reports what was measured."""
    try:
        run(*args)
    except KeyboardInterrupt:
        say("# interrupted: writing what was measured")


def device_plan(spec, world_size: int):
    """The devices of ``spec``'s ranks at ``world_size``, or the reason it cannot run here (str)."""
    from fixtures.devices import NotEnoughDevices, device_count, plan_devices

    try:
        return plan_devices(spec.device_type, world_size, device_count(spec.device_type), spec.shares_devices).devices
    except NotEnoughDevices as exc:
        return str(exc)


class WorldSlot:
    """The live World of one (backend, world size): started on first use, reset after a
    rank error, replaced after a hang or a dead rank, closed at the end."""

    def __init__(self, spec, world_size: int, devices, *, plugins=(), deadline: float = 60.0):
        self.spec, self.world_size, self.devices = spec, world_size, devices
        self.plugins, self.deadline = tuple(plugins), deadline
        self.world = None

    def get(self):
        """The world, ready for the next run; raises (WorldStartError, ...) if it cannot start."""
        from fixtures.errors import WorldError
        from fixtures.world import World

        world = self.world
        if world is not None and world.alive and world.tainted:
            try:
                world.reset()
            except WorldError:
                pass  # reset() killed it; start a new one below
        if world is None or not world.alive:
            if world is not None:
                world.kill()
            self.world = None
            world = World(self.spec, self.world_size, self.devices, plugins=self.plugins, deadline=self.deadline)
            world.start()
            self.world = world
        return world

    def close(self) -> None:
        if self.world is not None:
            self.world.close()
            self.world = None
