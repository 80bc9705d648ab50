"""suites/faults/table.py: one record per fault, each injectable and healable, named errors for unknown names."""

from __future__ import annotations

import pytest

from backends.spec import REQUIREMENT_KEYS
from fixtures.hosts import Traffic
from suites.faults import measure, measure_rank
from suites.faults import operations
from suites.faults.table import FAULTS, PLANES, TABLE, Fault, Target, named


def test_one_record_per_fault_with_a_known_plane():
    assert len(TABLE) == len(FAULTS) and all(fault.plane in PLANES for fault in FAULTS)
    # the list: partition, refused, one direction, flap, slow, loss, cut after N bytes, frozen, planes
    assert set(TABLE) == {"partition", "refused", "one_way", "flap", "slow", "lossy", "cut_after_bytes", "frozen",
                          "control_plane", "data_plane"}
    assert {f.name for f in FAULTS if not f.breaks} == {"slow", "lossy"}  # the negative controls
    assert tuple(TABLE) == REQUIREMENT_KEYS["fault"].values  # gaps name faults by the table's names


def test_one_record_per_operation_named_as_gaps_name_them():
    assert tuple(operations.BY_NAME) == REQUIREMENT_KEYS["operation"].values
    assert [op.name for op in operations.named("p2p,barrier")] == ["p2p", "barrier"]
    with pytest.raises(ValueError, match="unknown operation.*gossip; known: all_reduce"):
        operations.named(["gossip"])


def test_what_a_fault_reaches_follows_from_the_tables():
    at = {(f.name, op.name): operations.reached(f, op, 3) for f in FAULTS for op in operations.OPERATIONS}
    assert at["partition", "all_reduce"] == [0, 1, 2] and at["partition", "p2p"] == [0]  # the receiver waits
    assert at["partition", "store_get"] == [2] and at["refused", "store_get"] == []  # refused: the data plane only
    assert at["control_plane", "barrier"] == [] and at["cut_after_bytes", "barrier"] == []  # a few bytes only
    assert at["one_way", "barrier"] == [0, 1] and at["one_way", "p2p"] == [0]  # the cut-off rank still hears
    assert at["frozen", "store_get"] == [] and not any(at["slow", op] or at["lossy", op] for op in operations.BY_NAME)
    assert operations.unreached(TABLE["partition"], operations.BY_NAME["store_get"], 3) == [0, 1]
    assert operations.unreached(TABLE["partition"], operations.BY_NAME["p2p"], 3) == []  # the sender may end either way


def test_a_fault_states_how_a_wait_ends():
    assert {f.name for f in FAULTS if f.ends_by == "reset"} == {"refused", "cut_after_bytes"}
    with pytest.raises(ValueError, match="a breaking fault ends waits by one of timeout, reset"):
        Fault(name="x", doc="", inject=lambda t: None, heal=lambda t: None, ends_by="")


def test_named_faults_and_unknown_names():
    assert [f.name for f in named("partition,frozen")] == ["partition", "frozen"]
    with pytest.raises(ValueError, match="unknown fault.*sideways; known: partition"):
        named(["partition", "sideways"])


def test_a_bad_plane_is_refused():
    with pytest.raises(ValueError, match="plane must be one of both, data, control"):
        Fault(name="x", doc="", inject=lambda t: None, heal=lambda t: None, plane="air")


class Recording:
    """Stands in for SimulatedHosts: records what a fault asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, *args))


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_every_fault_lands_on_its_host_and_heals(fault, monkeypatch):
    from fixtures.hosts import faults as host_faults

    signals: list[tuple] = []
    monkeypatch.setattr(host_faults, "freeze", lambda pid: signals.append(("freeze", pid)))
    monkeypatch.setattr(host_faults, "thaw", lambda pid: signals.append(("thaw", pid)))
    hosts = Recording()
    target = Target(hosts, 1, 4242, 29500)  # type: ignore[arg-type]
    fault.inject(target)
    fault.heal(target)
    done = hosts.calls + signals
    assert done and all(call[1] in (1, 4242) for call in done), done  # the cut-off host (or its rank's pid)
    traffic = [arg for call in hosts.calls for arg in call if isinstance(arg, Traffic)]
    if fault.plane != "both":  # the store's port, alone or exempt
        assert traffic and all(t.port == 29500 and t.only_port == (fault.plane == "control") for t in traffic)


def test_measure_names_an_unknown_fault(capsys):
    with pytest.raises(SystemExit):
        measure.main(["--fault", "sideways"])
    assert "unknown fault(s) sideways" in capsys.readouterr().err


def test_figures_give_the_ratio_to_the_timeout():
    outcome = measure.Outcome("gloo", "partition", [
        {"rank": 0, "phase": "faulted", "ok": False, "seconds": 4.01, "error_type": "RuntimeError",
         "error": "Timed out waiting 4000ms\nmore"},
        {"rank": 1, "phase": "healed-1", "ok": True, "seconds": 0.0}], ["rank(s) [1] still in their first call"])
    rows = measure.figures([outcome])
    assert rows[0]["ratio_to_timeout"] == round(4.01 / measure_rank.PG_TIMEOUT_S, 3)
    assert rows[0]["error"] == "Timed out waiting 4000ms" and rows[1]["ok"] and rows[1]["error"] == ""
    assert rows[2]["phase"] == "not done" and not rows[2]["ok"]
    assert all(set(row) == set(measure.CSV_COLUMNS) for row in rows)


def test_the_faults_option_names_default_all_or_the_tables_faults():
    from suites.faults.conftest import DEFAULT_FAULTS, selected_faults

    assert selected_faults("default") == DEFAULT_FAULTS == ("partition", "refused", "slow")
    assert selected_faults("all") == tuple(TABLE) and selected_faults("frozen,lossy") == ("frozen", "lossy")
    with pytest.raises(pytest.UsageError, match="--faults: unknown fault.*sideways"):
        selected_faults("partition,sideways")
