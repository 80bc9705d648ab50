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
    assert [plan.for_rank(r) for r in range(world_size)] == ["cpu"] * world_size
    assert not plan.uses_accelerator


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("world_size", SIZES)
def test_cuda_rank_r_uses_cuda_r_or_skips_with_reason(world_size, count):
    if count >= world_size:
        plan = plan_devices("cuda", world_size, count)
        assert plan.device_type == "cuda"
        assert plan.devices == tuple(f"cuda:{r}" for r in range(world_size))
        assert [plan.for_rank(r) for r in range(world_size)] == [f"cuda:{r}" for r in range(world_size)]
        assert plan.uses_accelerator
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
