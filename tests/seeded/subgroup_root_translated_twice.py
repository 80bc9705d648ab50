"""Seeded bug: a subgroup's broadcast translates its root from global to group rank a second time.

c10d hands a backend the root as a rank of the group; a backend that
"translates" it again (subtracting the offset between the caller's global and
group rank) broadcasts from the wrong member. On the default group the offset
is 0, so every whole-world clause passes; on the suite's subgroup (every rank
but rank 0) the first member still comes out right by accident (the root
clamps to group rank 0). World size 3 is the smallest that shows it. Caught by
the subgroup contract (suites/c10d/test_subgroups.py::
test_subgroup_broadcast_global_root, root 2).
"""

import torch.distributed as dist

from tests.seeded.gloo_wrapper import GlooWrapper, register


class SubgroupRootTranslatedTwice(GlooWrapper):
    """broadcast subtracts (global rank - group rank) from the group root it was given."""

    def broadcast(self, tensors, opts):
        offset = dist.get_rank() - self.rank()  # 0 on the default group
        opts.rootRank = max(0, opts.rootRank - offset)  # BUG: the root is a group rank already
        return super().broadcast(tensors, opts)


DISTCONFORM_SPEC = register("subgroup_root_translated_twice", SubgroupRootTranslatedTwice)
