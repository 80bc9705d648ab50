"""A rank's configuration (fixtures/rank_config.py): typed, one JSON form, strictly decoded, fuzzed.

It crosses a process boundary (an environment variable, an Attach message), so anything that is not a
RankConfig is a ConfigError naming the key; nothing else may escape the decoder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.rank_config import CONFIG_ENV, ConfigError, ControllerLink, Placement, RankConfig, place_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("world_size, rank, backend, plugins, placements, store, env, init, pg_timeout, init_timeout, link")


def _config(**over) -> RankConfig:
    fields = dict(world_size=2, rank=1, backend="gloo", plugins=("my.plugin",),
                  placements=(Placement("cpu"), Placement("cpu", host="dcnet-1.2-0-h0",
                                                          socket_env={"GLOO_SOCKET_IFNAME": "eth0"})),
                  store=("127.0.0.1", 29500), env={"TORCH_DISTRIBUTED_DEBUG": "OFF"}, init="lazy", pg_timeout=60.0,
                  init_timeout=120.0, link=ControllerLink(("127.0.0.1", 4242), "ab" * 32, "/tmp/w", ("/repo",), True))
    return RankConfig(**{**fields, **over})


_names = st.text(st.characters(codec="utf-8"), max_size=8)
_placements = st.builds(Placement, _names, st.none() | _names, st.dictionaries(_names, _names, max_size=3))
_links = st.none() | st.builds(ControllerLink, st.tuples(_names, st.integers(0, 65535)), _names, _names,
                               st.lists(_names, max_size=3).map(tuple), st.booleans())


@st.composite
def configs(draw) -> RankConfig:
    size = draw(st.integers(1, 5))
    return RankConfig(world_size=size, rank=draw(st.none() | st.integers(0, size - 1)), backend=draw(_names),
                      plugins=tuple(draw(st.lists(_names, max_size=3))),
                      placements=tuple(draw(st.lists(_placements, min_size=size, max_size=size))),
                      store=(draw(_names), draw(st.integers(0, 65535))),
                      env=draw(st.dictionaries(_names, _names, max_size=3)), init=draw(st.sampled_from(("lazy", "eager"))),
                      pg_timeout=draw(st.floats(0, 1e6)), init_timeout=draw(st.floats(0, 1e6)), link=draw(_links))


@settings(max_examples=200, deadline=None)
@given(configs())
def test_a_rank_config_travels_as_json_and_back(config):
    assert RankConfig.from_json(config.to_json()) == config
    assert RankConfig.from_env(config.to_env()) == config


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _names,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_names, inner, max_size=4),
                     max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(configs(), st.data())
def test_any_value_under_any_key_is_a_rank_config_or_a_config_error(config, data):
    """One key of a good configuration replaced by arbitrary JSON (or removed, or one added)."""
    document = json.loads(config.to_json())
    key = data.draw(st.sampled_from(sorted(document) + ["extra"]))
    if data.draw(st.booleans()) and key in document:
        del document[key]
    else:
        document[key] = data.draw(_json)
    try:
        RankConfig.from_json(json.dumps(document))
    except ConfigError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=40), _json.map(json.dumps)))
def test_any_text_is_a_rank_config_or_a_config_error(text):
    try:
        RankConfig.from_json(text)
    except ConfigError:
        pass


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(extra=1), f"unknown key(s) extra (a RankConfig has exactly {KEYS})"),
    (lambda d: d.pop("store"), "rank configuration: missing key(s) store"),
    (lambda d: d.update(world_size="2"), "rank configuration.world_size: expected int, got str '2'"),
    (lambda d: d.update(rank=True), "rank configuration.rank: expected int, got bool True"),
    (lambda d: d.update(store=["h", "1"]), "rank configuration.store[1]: expected int"),
    (lambda d: d.update(plugins="my.plugin"), "rank configuration.plugins: expected a list of str"),
    (lambda d: d.update(env={"A": 1}), "rank configuration.env['A']: expected str, got int 1"),
    (lambda d: d["placements"][1].pop("host"), "rank configuration.placements[1]: missing key(s) host"),
    (lambda d: d["link"].update(die_with_parent="yes"), "rank configuration.link.die_with_parent: expected bool"),
    (lambda d: d["placements"].pop(), "placements: one per rank, got 1 for world size 2"),
    (lambda d: d.update(rank=2), "rank 2 is not in a world of size 2"),
    (lambda d: d.update(init="later"), "init must be one of lazy, eager, got 'later'"),
])
def test_a_rank_config_refuses_unknown_missing_or_mistyped_keys_naming_them(change, message):
    document = json.loads(_config().to_json())
    change(document)
    with pytest.raises(ConfigError) as info:
        RankConfig.from_json(json.dumps(document))
    assert message in str(info.value)


def test_a_rank_answers_a_bad_attach_with_init_failed_naming_the_key():
    """What a launched rank does with an Attach it cannot use: says why, stays up for the next one."""
    from multiprocessing import Pipe

    from fixtures.protocol import Attach, Exit, InitFailed, recv, send
    from fixtures.rank_server import RankServer

    ours, theirs = Pipe()
    send(ours, Attach(json.dumps({"world_size": 2})))
    send(ours, Attach(_config(rank=0).to_json()))
    send(ours, Exit())
    RankServer(1, theirs).serve()
    missing, misdelivered = recv(ours), recv(ours)
    assert isinstance(missing, InitFailed) and isinstance(misdelivered, InitFailed)
    assert missing.failure.first_line() == (
        "fixtures.rank_config.ConfigError: Attach.config: missing key(s) rank, backend, plugins, placements, store, "
        f"env, init, pg_timeout, init_timeout, link (a RankConfig has exactly {KEYS})")
    assert misdelivered.failure.first_line() == ("fixtures.rank_config.ConfigError: a configuration for rank 0 "
                                                 "reached rank 1")


def test_placement_is_decided_once_device_and_host_per_rank():
    class Host:
        namespace = "dcnet-9.9-0-h1"

        def socket_env(self) -> dict[str, str]:
            return {"GLOO_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0"}

    assert place_ranks(("cpu", "cpu")) == (Placement("cpu"), Placement("cpu"))
    assert place_ranks(("cuda:0", "cuda:1"), [None, Host()]) == (
        Placement("cuda:0"), Placement("cuda:1", "dcnet-9.9-0-h1", {"GLOO_SOCKET_IFNAME": "eth0",
                                                                     "TP_SOCKET_IFNAME": "eth0"}))
    with pytest.raises(ValueError, match="one host per rank: 1 hosts for 2 ranks"):
        place_ranks(("cpu", "cpu"), [None])


def test_a_rank_started_without_its_configuration_says_why():
    env = {k: v for k, v in os.environ.items() if k != CONFIG_ENV}
    proc = subprocess.run([sys.executable, "-m", "fixtures.rank_main"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"distconform: a rank cannot start: ${CONFIG_ENV} is not set: a rank is started "
                                   "by its world (fixtures/world.py), not on its own")
    proc = subprocess.run([sys.executable, "-m", "fixtures.rank_main"], cwd=ROOT, capture_output=True, text=True,
                          env={**env, **_config(link=None).to_env()}, timeout=120)
    assert proc.returncode == 2
    assert "$DISTCONFORM_RANK_CONFIG.link: a rank the controller starts needs the way back to it" in proc.stderr


def test_entering_a_host_that_does_not_exist_names_it():
    from fixtures.hosts.enter import EnterHostError, enter_namespace

    with pytest.raises(EnterHostError, match="network namespace 'dcnet-no-such-host' of this rank's host: cannot open"):
        enter_namespace("dcnet-no-such-host")


def test_a_rank_placed_on_a_simulated_host_sees_that_hosts_interfaces():
    """The hook a rank runs for ``Placement.host`` (fixtures/hosts/enter.py), in a process of its own."""
    from fixtures.hosts import SimulatedHosts, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    script = ("import socket, sys\nfrom fixtures.hosts.enter import enter_namespace\nenter_namespace(sys.argv[1])\n"
              "print(sorted(name for _, name in socket.if_nameindex()))")
    with SimulatedHosts(1) as hosts:
        proc = subprocess.run([sys.executable, "-c", script, hosts[0].namespace], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(["lo", hosts[0].device]))
