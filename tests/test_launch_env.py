"""fixtures/launch/env.py: the launchers' variables and the pytest options a launch decides itself
(world size, the one debug level); usage errors are one line on every rank."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fixtures.launch.env import (LaunchError, detect, first_slurm_host, host_and_port, split_debug_level,
                                 split_world_size)
from tests.harness_cases.procs import REPO_ROOT


def _torchrun_env(**over):
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n0",
           "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True",
           "TORCHELASTIC_RESTART_COUNT": "0", "DISTCONFORM_HOSTNAME": "n1"}
    env.update(over)
    return env


def test_torchrun_variables():
    info = detect(_torchrun_env())
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("torchrun", 5, 8, 1, 4)
    assert (info.master_addr, info.master_port, info.agent_store, info.hostname) == ("n0", 29500, True, "n1")


def test_slurm_variables_first_host_and_port():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"}
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("srun", 3, 4, 1, 2)
    assert (info.master_addr, info.master_port) == ("gpu07", 20000 + 123456 % 10000)
    assert detect(dict(env, MASTER_PORT="4242", MASTER_ADDR="head")).master_port == 4242
    assert detect(dict(env, MASTER_PORT="4242", MASTER_ADDR="head")).master_addr == "head"


@pytest.mark.parametrize("nodelist, first", [("gpu[07-09,12],cpu1", "gpu07"), ("a1", "a1"), ("a1,b2", "a1"),
                                             ("node[3]", "node3"), ("10.0.0.5", "10.0.0.5")])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


@pytest.mark.parametrize("rank, size, local, local_size", [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")])
def test_mpi_variables(rank, size, local, local_size):
    env = {rank: "2", size: "4", local: "0", local_size: "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("mpirun", 2, 4, 0, 2)
    with pytest.raises(LaunchError, match="MASTER_ADDR is not"):
        detect({k: v for k, v in env.items() if k != "MASTER_ADDR"})


@pytest.mark.parametrize("env, message", [
    ({}, "no launcher variables found"),
    (_torchrun_env(RANK="8"), "rank 8 is outside world size 8"),
    (_torchrun_env(MASTER_PORT="http"), "MASTER_PORT='http' is not an integer"),
    (_torchrun_env(MASTER_PORT="70000"), "port 70000 is not a valid TCP port"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM variable SLURM_LOCALID is not set"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "[", "SLURM_JOB_ID": "1"},
     "cannot be parsed"),
])
def test_bad_launcher_variables_are_one_line_errors(env, message):
    with pytest.raises(LaunchError, match=message) as info:
        detect(env)
    assert "\n" not in str(info.value)


_VARS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
         "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
         "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_VARS), st.one_of(st.integers(-3, 70000).map(str), st.text(max_size=12))))
@example({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "\u00b2",
          "SLURM_JOB_NODELIST": "a", "SLURM_JOB_ID": "1"})
@example({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "MASTER_ADDR": "0"})  # no port to derive
@example({"OMPI_COMM_WORLD_RANK": "0", "MASTER_ADDR": "0", "MASTER_PORT": ":"})
def test_any_launcher_environment_is_a_launch_info_or_a_one_line_error(env):
    try:
        info = detect(env)
    except LaunchError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert 0 <= info.rank < info.world_size and 0 < info.master_port < 2 ** 16


def test_world_size_may_be_omitted_and_must_agree():
    info = detect(_torchrun_env())
    assert split_world_size(["suites/", "-q"], info) == ["suites/", "-q", "--world-size", "8"]
    assert split_world_size(["--world-size", "8", "-q"], info) == ["-q", "--world-size", "8"]
    assert split_world_size(["--world-size=8"], info) == ["--world-size", "8"]
    for bad in (["--world-size", "4"], ["--world-size=8,4"], ["--world-size", "2,3"]):
        with pytest.raises(LaunchError, match="disagrees with the launcher: torchrun started 8 ranks"):
            split_world_size(bad, info)


def test_a_launched_world_runs_at_one_debug_level():
    """--debug-level if given, else the launcher's $TORCH_DISTRIBUTED_DEBUG, else OFF; pytest gets exactly it."""
    assert split_debug_level(["suites/"], {}) == (["suites/", "--debug-level", "OFF"], "OFF")
    assert split_debug_level(["suites/"], {"TORCH_DISTRIBUTED_DEBUG": "detail"})[1] == "DETAIL"
    assert split_debug_level(["--debug-level", "info", "-q"], {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}) == (
        ["-q", "--debug-level", "INFO"], "INFO")
    assert split_debug_level(["--debug-level=DETAIL,detail"], {})[1] == "DETAIL"
    for args, env in ((["--debug-level", "OFF,DETAIL"], {}), (["--debug-level", "OFF", "--debug-level=INFO"], {}),
                      ([], {"TORCH_DISTRIBUTED_DEBUG": "INFO,DETAIL"})):
        with pytest.raises(LaunchError, match="a launched world runs at one TORCH_DISTRIBUTED_DEBUG level"):
            split_debug_level(args, env)
    with pytest.raises(LaunchError, match="--debug-level LOUD: 'LOUD' is not a TORCH_DISTRIBUTED_DEBUG level"):
        split_debug_level(["--debug-level", "LOUD"], {})
    with pytest.raises(LaunchError, match=r"\$TORCH_DISTRIBUTED_DEBUG='x': 'x' is not"):
        split_debug_level([], {"TORCH_DISTRIBUTED_DEBUG": "x"})


@pytest.mark.parametrize("args, env, expected", [
    (["--world-size", "3"], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": "1"},
     "distconform.launch: error: --world-size 3 disagrees with the launcher: torchrun started 2 ranks "
     "(omit --world-size under a launcher)"),
    (["suites/", "-n", "2"], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": "1"},
     "distconform.launch: error: -n: pytest-xdist cannot share one launched world (its ranks are the launcher's "
     "processes); drop -n/--dist"),
    (["--controller-address", "head:http"], {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     "distconform.launch: error: --controller-address 'head:http': expected HOST[:PORT], or an IPv6 address as "
     "::1 or [::1]:PORT"),
    (["--debug-level", "OFF,DETAIL"], {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     "distconform.launch: error: --debug-level OFF,DETAIL: a launched world runs at one TORCH_DISTRIBUTED_DEBUG "
     "level (its ranks start once), not OFF, DETAIL: launch once per level"),
    ([], {}, "distconform.launch: error: no launcher variables found: run under torchrun, srun or mpirun "
             "(torchrun --nproc-per-node N -m fixtures.launch suites/ --backend gloo)"),
    ([], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
          "DISTCONFORM_HEARTBEAT_TIMEOUT": "soon"},
     "distconform.launch: error: $DISTCONFORM_HEARTBEAT_TIMEOUT='soon': expected a positive number of seconds"),
    ([], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
          "DISTCONFORM_SECRET_FILE": "/nonexistent/secret"},
     "distconform.launch: error: $DISTCONFORM_SECRET_FILE: cannot read /nonexistent/secret: No such file or directory"),
])
def test_usage_errors_are_one_line_on_every_rank(args, env, expected):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "OMPI_", "PMI", "TORCHELASTIC"))}
    proc = subprocess.run([sys.executable, "-m", "fixtures.launch", *args], cwd=REPO_ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4
    assert proc.stderr.strip().splitlines() == [expected]


@pytest.mark.parametrize("text, expected", [
    ("head", ("head", 0)), ("head:29500", ("head", 29500)), ("::1", ("::1", 0)), ("[::1]:29500", ("::1", 29500)),
    ("[fe80::1%eth0]", ("fe80::1%eth0", 0)), (":4242", ("", 4242)), ("10.0.0.5:1", ("10.0.0.5", 1))])
def test_controller_address_forms(text, expected):
    assert host_and_port(text) == expected


@pytest.mark.parametrize("text", ["head:http", "[::1", "[::1]x", "[]:1", "head:70000", "head:-1"])
def test_bad_controller_address_is_a_one_line_error(text):
    with pytest.raises(LaunchError, match="expected HOST\\[:PORT\\], or an IPv6 address as ::1 or \\[::1\\]:PORT"):
        host_and_port(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=24))
def test_any_controller_address_is_parsed_or_a_one_line_error(text):
    try:
        host, port = host_and_port(text)
    except LaunchError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"--controller-address {text!r}: ")
        return
    assert 0 <= port < 2 ** 16 and isinstance(host, str)
