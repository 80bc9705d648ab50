"""Injected failures inside a pytest run (run explicitly by tests/test_cli.py).

Each failing test is followed by a normal one: the harness must fail the bad
test with its diagnosis and give the next test a fresh, working world.
"""

import pytest

from tests.harness_cases import rank_fns


def _expected_sum(world):
    return [world.world_size * (world.world_size + 1) / 2.0] * world.world_size


@pytest.mark.deadline(3)
def test_injected_hang(world):
    world.run(rank_fns.hang_rank0_sleeps)


def test_after_hang(world):
    assert world.run(rank_fns.all_reduce_rank_sum) == _expected_sum(world)


def test_injected_crash(world):
    world.run(rank_fns.crash_rank1_exit7)


def test_after_crash(world):
    assert world.run(rank_fns.all_reduce_rank_sum) == _expected_sum(world)
