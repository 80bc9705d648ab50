"""fixtures/launch/plugin.py: the pytest side of a launched run: the harness's world-pool hook, the run order."""

from __future__ import annotations

import os

import pytest


# ------------------------------------------------------------ run order
class _Item:
    """What order_for_launched_world reads of a pytest item: its target, xfail marker and gap."""

    def __init__(self, name, target, gap=None):
        from types import SimpleNamespace

        from fixtures.pytest_plugin import mark_gap

        self.name, self.stash, self.markers = name, pytest.Stash(), {}
        self.callspec = SimpleNamespace(params={"world_target": SimpleNamespace(id=target)})
        mark_gap(self, gap, "gloo")

    def add_marker(self, mark):
        self.markers[mark.name] = mark

    def get_closest_marker(self, name):
        return self.markers.get(name)


def test_gaps_that_lose_the_world_run_last_in_their_world_by_their_declared_consequence():
    from backends.builtin import BUILTIN_SPECS
    from fixtures.launch.plugin import order_for_launched_world

    gloo = BUILTIN_SPECS["gloo"]
    aborts = gloo.gap_for(bad_input="all_reduce_mismatched_shapes", env={"TORCH_DISTRIBUTED_DEBUG": "OFF"})
    # its reason says "abort" (_abort_process_group) but it only fails: a text match would misorder it
    pending = gloo.gap_for(feature="abort", work="pending_on_abort")
    assert (aborts.consequence, pending.consequence) == ("kills_rank", "fails") and "abort" in pending.reason
    items = [_Item("kills", "ws4", aborts), _Item("a", "ws4"), _Item("pending", "ws4", pending),
             _Item("other-world", "ws2"), _Item("b", "ws4")]
    assert [i.name for i in order_for_launched_world(items, ["ws2", "ws4"])] == [
        "other-world", "a", "b", "pending", "kills"]


def test_a_gap_consequence_is_one_of_the_declared_ones():
    from backends.spec import CONSEQUENCES, Gap

    assert Gap({"feature": "abort"}, "r", consequence="hangs").loses_world
    assert not Gap({"feature": "abort"}, "r").loses_world
    with pytest.raises(ValueError, match="consequence 'crashes' is not one of " + ", ".join(CONSEQUENCES)):
        Gap({"feature": "abort"}, "r", consequence="crashes")


# ------------------------------------------------------------ where worlds come from
HOOKED_POOL = '''
import os

import os

import pytest

from fixtures.pool import WorldPool
from fixtures.spawner import Zygote


def _no_fork_server(*args, **kwargs):
    raise AssertionError("the harness started a fork server although a plugin gave the pool")


Zygote.warm_up = Zygote.get = classmethod(_no_fork_server)


class NoWorlds(WorldPool):
    """Hosts world size 2 only, and starts no world: enough to see what the harness asks of it."""

    def cannot_host(self, spec, world_size):
        return "" if world_size == 2 else f"this pool hosts 2 ranks, not {world_size}"

    def warm_up(self):
        open(os.environ["POOL_WARMED"], "w").close()

    def get(self, backend, world_size, debug_level="OFF", init="lazy"):
        pytest.skip(f"asked for {backend} at {world_size} ranks, {debug_level}")


def pytest_distconform_world_pool(config, registry):
    return NoWorlds(registry)
'''


def test_a_plugins_world_pool_replaces_the_local_one_and_no_fork_server_starts(tmp_path, monkeypatch):
    """The harness asks pytest_distconform_world_pool (fixtures/hookspecs.py): a plugin's pool decides
    which targets can run and serves the worlds; the targets keep their debug level; the local fork
    server is never started (as under fixtures.launch, whose plugin answers the same hook)."""
    from tests.harness_cases.procs import REPO_ROOT, run_pytest

    (tmp_path / "hooked_pool.py").write_text(HOOKED_POOL)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), REPO_ROOT]))
    monkeypatch.setenv("POOL_WARMED", str(tmp_path / "warmed"))
    run = run_pytest(["-p", "hooked_pool", "tests/harness_cases/launch_cases.py", "-k", "placement",
                      "--world-size", "2,3", "--debug-level", "DETAIL", "-rs"], tmp_path / "report")
    assert run.returncode == 0, run.output
    assert (tmp_path / "warmed").exists()  # the plugin's pool was warmed up instead
    skipped = {case["nodeid"].split("::")[1]: case["reason"] for case in run.cases().values()}
    assert skipped == {"test_placement[gloo-ws2-DETAIL]": "asked for gloo at 2 ranks, DETAIL",
                       "test_placement[gloo-ws3-DETAIL]": "this pool hosts 2 ranks, not 3"}
