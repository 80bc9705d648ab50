"""A hang inside a pytest run (run explicitly by tests/test_hang_report.py): the last rank skips an all_reduce.

The harness's deadline fires; the failure must name the rank that never entered
the all_reduce and keep every rank's flight-recorder dump in the report folder.
"""

import pytest

from tests.harness_cases import rank_fns


@pytest.mark.deadline(3)
def test_last_rank_skips_an_all_reduce(world):
    world.run(rank_fns.all_reduce_skipped_by, world.world_size - 1)
