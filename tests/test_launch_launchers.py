"""srun, Open MPI and a real mpirun start a launched world, and the sbatch script of the docs runs
verbatim under a stand-in srun (docs/clusters.md; tests/harness_cases/launch_nodes.py). The simulated
nodes run on this host's loopback, or under ``--hosts netns`` each on a simulated host of its own (the
launcher's master address is node 0's)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tests.harness_cases.launch_nodes import SimulatedNodes, free_port, run_nodes, run_tasks
from tests.harness_cases.procs import REPO_ROOT


def test_srun_environment(tmp_path, launch_hosts):
    """Three tasks on two simulated nodes as srun sets them up (block distribution, 2 + 1)."""
    port = str(free_port())
    hosts = ["node0", "node0", "node1"]
    node_of = [0, 0, 1]
    with SimulatedNodes(2, launch_hosts) as nodes:
        def env_of(rank):
            return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(rank % 2),
                    "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": nodes.master_addr, "SLURM_JOB_ID": "4711",
                    "MASTER_PORT": port, "DISTCONFORM_HOSTNAME": hosts[rank], "EXPECT_HOSTS": ",".join(hosts),
                    **nodes.expect_addresses(node_of)}

        results, outcomes = run_tasks(env_of, 3, tmp_path, nodes=nodes, node_of=node_of.__getitem__)
    assert [rc for rc, _ in results] == [0, 0, 0], results[0][1][-3000:]
    assert outcomes == {"tests/harness_cases/launch_cases.py::test_placement[gloo-ws3]": "passed"}


def test_open_mpi_environment(tmp_path, launch_hosts):
    port = str(free_port())
    with SimulatedNodes(2, launch_hosts) as nodes:
        def env_of(rank):
            return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": nodes.master_addr, "MASTER_PORT": port,
                    "DISTCONFORM_HOSTNAME": f"node{rank}", "EXPECT_HOSTS": "node0,node1",
                    **nodes.expect_addresses([0, 1])}

        results, outcomes = run_tasks(env_of, 2, tmp_path, nodes=nodes, node_of=lambda rank: rank)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    assert outcomes == {"tests/harness_cases/launch_cases.py::test_placement[gloo-ws2]": "passed"}


def test_mpirun(tmp_path, launch_hosts):
    """A real mpirun, 2 ranks. On simulated hosts each rank is an application context of its own (MPMD,
    ``-np 1 CMD : -np 1 CMD``) whose command starts inside its host, as mpirun's daemon would on each node."""
    if shutil.which("mpirun") is None:
        # .ci/run installs openmpi-bin: in CI a missing mpirun is a broken setup, not a reason to skip
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "mpirun is not installed (apt-get install openmpi-bin); the Open MPI variables are covered by "
            "test_open_mpi_environment")
    port = str(free_port())
    rank_argv = [sys.executable, "-m", "fixtures.launch", "tests/harness_cases/launch_cases.py", "-k", "placement",
                 "-p", "no:cacheprovider", "--report-dir", str(tmp_path / "report")]
    with SimulatedNodes(2, launch_hosts) as nodes:
        env = {"MASTER_ADDR": nodes.master_addr, "MASTER_PORT": port, "PYTHONPATH": REPO_ROOT,
               **nodes.env(0), **nodes.expect_addresses([0, 1])}  # every node picks the same interface name
        exported = [arg for name in sorted(env) for arg in ("-x", name)]
        argv = ["mpirun", "--oversubscribe", *exported]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        if nodes.hosted:
            argv += ["-np", "1", *nodes[0].command(rank_argv), ":", "-np", "1", *nodes[1].command(rank_argv)]
        else:
            argv += ["-np", "2", *rank_argv]
        results = run_nodes([(argv, env)], tmp_path, nodes=nodes)
    assert results[0][0] == 0, results[0][1][-3000:]
    with open(tmp_path / "report" / "conformance.json") as fh:
        assert {c["nodeid"]: c["outcome"] for c in json.load(fh)["cases"]} == {
            "tests/harness_cases/launch_cases.py::test_placement[gloo-ws2]": "passed"}


FAKE_SRUN = """#!/bin/bash
# stand-in for srun on one host: SLURM_NTASKS tasks, block-distributed over SLURM_NNODES simulated nodes;
# node n's tasks start behind the n-th ';'-separated command prefix of STAND_IN_SRUN_NODE_PREFIXES, if any
# (ip netns exec NAME: the node's simulated host)
per_node=$(( (SLURM_NTASKS + SLURM_NNODES - 1) / SLURM_NNODES ))
IFS=';' read -ra prefixes <<< "${STAND_IN_SRUN_NODE_PREFIXES:-}"
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    node=$((i / per_node))
    SLURM_PROCID=$i SLURM_LOCALID=$((i % per_node)) SLURM_NTASKS_PER_NODE=$per_node \\
        DISTCONFORM_HOSTNAME=node$node ${prefixes[node]:-} "$@" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""


def _readme_sbatch_script() -> str:
    import re

    with open(os.path.join(REPO_ROOT, "docs", "clusters.md")) as fh:  # the README links there
        section = fh.read()
    scripts = [b for b in re.findall(r"```sh\n(.*?)```", section, flags=re.S) if b.startswith("#!/bin/bash")]
    assert len(scripts) == 1
    return scripts[0]


def test_readme_sbatch_script_runs_under_a_stand_in_srun(tmp_path, launch_hosts):
    """The sbatch script of docs/clusters.md, verbatim, on 2 simulated nodes x 2 tasks (the suite selection overridden)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # "the venv is active"
    (bin_dir / "python").chmod(0o755)
    script = tmp_path / "distconform.sbatch"
    script.write_text(_readme_sbatch_script())
    with SimulatedNodes(2, launch_hosts) as nodes:
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
               "SLURM_JOB_ID": "4711", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
               "SLURM_JOB_NODELIST": nodes.master_addr, "MASTER_PORT": str(free_port()),
               "EXPECT_HOSTS": "node0,node0,node1,node1", **nodes.env(0), **nodes.expect_addresses([0, 0, 1, 1]),
               "STAND_IN_SRUN_NODE_PREFIXES": ";".join(" ".join(node.exec_prefix) for node in nodes.nodes),
               "DISTCONFORM_ARGS": f"tests/harness_cases/launch_cases.py -k placement -p no:cacheprovider "
                                   f"--report-dir {tmp_path / 'report'}"}
        [(rc, out)] = run_nodes([(["bash", str(script)], env)], tmp_path, nodes=nodes)
    assert rc == 0, out[-3000:]
    with open(tmp_path / "report" / "conformance.json") as fh:
        assert {c["nodeid"]: c["outcome"] for c in json.load(fh)["cases"]} == {
            "tests/harness_cases/launch_cases.py::test_placement[gloo-ws4]": "passed"}
    assert not os.path.exists(tmp_path / ".distconform-4711.key")  # the script removes its secret
