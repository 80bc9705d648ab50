"""Seeded bug: the reference reports the options of the first group it made, not each group's own.

The options a group's backend reports (``group._get_backend(cpu).options``) are
built once per process and cached: every later group, a subgroup made with
``pg_options`` and ``timeout=`` or a default group destroyed and made again
with another timeout, reports the first group's timeout (the world's default
group's), while its collectives run under their own. A rebuilt group that
reports a timeout it does not run with is how issue 25's 600 s kills go unseen.
Caught by suites/c10d/test_shrink_and_options.py::test_pg_options_round_trip.
"""

import torch

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


_FIRST_TIMEOUT: list = []


class OptionsCached(ReferenceProcessGroup):
    """Reports the timeout of the first group made in the process."""

    @property
    def options(self):
        if not _FIRST_TIMEOUT:
            _FIRST_TIMEOUT.append(self.timeout)
        reported = torch._C._distributed_c10d.Backend.Options("reference", _FIRST_TIMEOUT[0])  # BUG: not self.timeout
        reported.group_name = self.getGroupName()
        reported.global_ranks_in_group = list(self.global_ranks)
        return reported


DISTCONFORM_SPEC = register_reference("reference_options_cached", OptionsCached)
