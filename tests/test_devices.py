"""fixtures/devices.py: which device each rank uses, and when a world cannot be placed."""

import pytest

from fixtures.devices import DevicePlan, NotEnoughDevices, bind_rank_to_device, plan_devices

COUNTS = range(0, 9)
SIZES = range(1, 9)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("world_size", SIZES)
def test_cpu_every_rank_uses_cpu(world_size, count):
    plan = plan_devices("cpu", world_size, count)
    assert plan == DevicePlan("cpu", ("cpu",) * world_size)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("world_size", SIZES)
def test_cuda_rank_r_uses_cuda_r_or_skips_with_reason(world_size, count):
    if count >= world_size:
        plan = plan_devices("cuda", world_size, count)
        assert plan.device_type == "cuda"
        assert plan.devices == tuple(f"cuda:{r}" for r in range(world_size))
        assert len(set(plan.devices)) == world_size  # no two ranks share a GPU
    else:
        with pytest.raises(NotEnoughDevices) as info:
            plan_devices("cuda", world_size, count)
        assert str(info.value) == f"needs {world_size} GPUs"


def test_other_accelerator_is_named_in_the_reason():
    assert plan_devices("xpu", 2, 4).devices == ("xpu:0", "xpu:1")
    with pytest.raises(NotEnoughDevices, match=r"^needs 3 xpu devices$"):
        plan_devices("xpu", 3, 2)


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
@pytest.mark.parametrize("world_size", [0, -1])
def test_invalid_world_size_is_a_value_error(device_type, world_size):
    with pytest.raises(ValueError, match="world size"):
        plan_devices(device_type, world_size, 8)


def test_bind_cpu_is_a_no_op():
    assert bind_rank_to_device("cpu") is None


# ---- worlds launched across nodes (fixtures/launch/): cuda:LOCAL_RANK, never cuda:RANK
from fixtures.devices import Placement, plan_launched_devices  # noqa: E402


def _placements(nodes: int, per_node: int, gpus: int) -> list[Placement]:
    # torchrun/srun order: global rank = node * per_node + local rank
    return [Placement(f"node{n}", l, gpus) for n in range(nodes) for l in range(per_node)]


@pytest.mark.parametrize("gpus", range(0, 5))
@pytest.mark.parametrize("per_node", range(1, 5))
@pytest.mark.parametrize("nodes", range(1, 4))
def test_launched_rank_uses_its_local_rank_or_skips_naming_the_host(nodes, per_node, gpus):
    places = _placements(nodes, per_node, gpus)
    if gpus >= per_node:
        plan = plan_launched_devices("cuda", places)
        assert plan.devices == tuple(f"cuda:{r % per_node}" for r in range(nodes * per_node))
        # the #47629/#47797 bug class: on node 2 a global-rank mapping names devices the host lacks
        assert all(int(d.split(":")[1]) < gpus for d in plan.devices)
        used = [(p.host, d) for p, d in zip(places, plan.devices)]
        assert len(set(used)) == len(used)  # no two ranks of a host share a GPU
    else:
        with pytest.raises(NotEnoughDevices) as info:
            plan_launched_devices("cuda", places)
        assert str(info.value) == f"host node0 runs local ranks up to {per_node - 1}: needs {per_node} GPUs, has {gpus}"


def test_launched_single_node_agrees_with_the_local_plan():
    for n in range(1, 5):
        assert plan_launched_devices("cuda", _placements(1, n, 4)) == plan_devices("cuda", n, 4)


def test_launched_cpu_ignores_device_counts():
    assert plan_launched_devices("cpu", _placements(2, 3, 0)).devices == ("cpu",) * 6


def test_launched_interleaved_ranks_still_map_by_local_rank():
    # mpirun --map-by node: ranks alternate between hosts
    places = [Placement("a", 0, 2), Placement("b", 0, 2), Placement("a", 1, 2), Placement("b", 1, 2)]
    assert plan_launched_devices("cuda", places).devices == ("cuda:0", "cuda:0", "cuda:1", "cuda:1")


def test_launched_duplicate_local_rank_is_a_value_error():
    with pytest.raises(ValueError, match="host a: ranks \\[0, 1\\] do not have distinct local ranks"):
        plan_launched_devices("cuda", [Placement("a", 0, 2), Placement("a", 0, 2)])


@pytest.mark.parametrize("count", range(1, 5))
@pytest.mark.parametrize("world_size", SIZES)
def test_shared_plan_puts_rank_r_on_r_mod_count(world_size, count):
    """A spec with shares_devices (gloo-cuda) runs any world size on the GPUs there are."""
    plan = plan_devices("cuda", world_size, count, shared=True)
    assert plan.devices == tuple(f"cuda:{r % count}" for r in range(world_size))


def test_shared_plan_still_needs_one_device():
    with pytest.raises(NotEnoughDevices, match=r"^needs a GPU$"):
        plan_devices("cuda", 2, 0, shared=True)
