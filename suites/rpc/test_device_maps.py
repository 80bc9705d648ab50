"""Contract: with device maps, accelerator tensors cross RPC onto the devices the maps name, and back.

A worker whose options map its own device to each peer's
(``TensorPipeRpcBackendOptions(device_maps={peer: {mine: theirs}}, devices=[mine])``, what the harness gives
an agent on accelerator ranks: backends/rpc_agents.py:device_maps) sends a tensor on its device and the
callee gets it on the device the map names; the callee's tensor result comes back on the caller's device
(TensorPipe inverts the map for replies), for rpc_sync, rpc_async and remote().to_here() alike, values
exact. Without a map for the destination, an accelerator tensor is refused with an error naming the
device, never moved silently to the CPU. The ranks must be on an accelerator of any type (one GPU is
enough: TensorPipe maps cuda:0 to cuda:0 between two processes; the dcdev test device gives rank r
dcdev:r); on CPU ranks the clauses skip saying so. An agent whose options take another device type's
maps only (TensorPipe: CUDA) starts without maps there, as a user's must, and its gap says so.
"""

import pytest
import torch

from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.rpc import udfs
from suites.rpc.call_modes import CALLS, FUNCTION_CALLS
from suites.rpc.common import outcome_of, peer_name


# ---------------------------------------------------------------- rank side
def send_on_my_device(rpc_call):
    """(the device the peer saw my tensor on, the device and value its reply came back with)."""
    rpc = lifecycle.rpc()
    mine = torch.arange(4.0, device=ctx.device) + ctx.rank
    seen = CALLS[rpc_call].invoke(rpc, peer_name(), udfs.device_of, (mine,))
    back = CALLS[rpc_call].invoke(rpc, peer_name(), torch.add, (mine, 1))
    return seen, str(back.device), back.cpu()


def send_without_a_map():
    with lifecycle.private_agent(devices=()) as rpc:
        return outcome_of(rpc.rpc_sync, peer_name(), torch.add, args=(torch.ones(2, device=ctx.device), 1))


# ---------------------------------------------------------------- clauses
@pytest.fixture
def accelerator_ranks(backend_spec) -> None:
    """Skip, saying why, where device maps do not apply: before rpc_agent, so a skip starts no agent."""
    if backend_spec.device_type == "cpu":
        pytest.skip(f"device maps move accelerator tensors; {backend_spec.name}'s ranks are on the cpu (run the RPC "
                    f"areas on an accelerator's backend: --backend gloo-cuda or nccl on a GPU machine, or "
                    f"--backend-plugin native.device --backend native-dcdev anywhere)")


@pytest.mark.needs(rpc_feature="device_maps")
@pytest.mark.parametrize("rpc_call", FUNCTION_CALLS)
def test_tensor_crosses_onto_the_mapped_device_and_back(accelerator_ranks, rpc_agent, rpc_call):
    """An accelerator tensor reaches the callee on the device the map names; its reply returns on the caller's device."""
    devices = rpc_agent.world.devices
    for rank, (seen, back_device, back) in enumerate(rpc_agent.run(send_on_my_device, rpc_call)):
        to = (rank + 1) % rpc_agent.world_size
        assert seen == str(torch.device(devices[to])), \
            f"rank {rank} {rpc_call}: worker{to} got the tensor on {seen}, its map names {devices[to]}"
        assert back_device == str(torch.device(devices[rank])), \
            f"rank {rank} {rpc_call}: the reply came back on {back_device}, the caller is on {devices[rank]}"
        assert torch.equal(back, torch.arange(4.0) + rank + 1), f"rank {rank} {rpc_call}: reply {back.tolist()}"


@pytest.mark.rpc_private_agent
def test_unmapped_destination_refuses_accelerator_tensors(accelerator_ranks, rpc_agent):
    """Without a device map for the destination an accelerator tensor is refused with an error naming devices."""
    for rank, got in enumerate(rpc_agent.run(send_without_a_map)):
        assert got.raised and "device" in got.error.lower(), \
            f"rank {rank}: an unmapped rpc_sync of a tensor on {rpc_agent.world.devices[rank]} to " \
            f"worker{(rank + 1) % rpc_agent.world_size} {got.describe()}"
