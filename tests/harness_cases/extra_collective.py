"""A collective added by one table entry: ``--backend-plugin tests.harness_cases.extra_collective``.

Importing it adds ``all_reduce_coalesced`` (torch.distributed.all_reduce_coalesced
over a one-tensor list) to suites/collectives.py's table, in the pytest
process and in every rank (plugins are imported in both). Nothing else is
written for it: the differential suite draws and checks it, the timeout
clause makes it a case and the benchmark measures it (tests/test_collectives_table.py).
"""

import warnings

from suites import collectives as table

NAME = "all_reduce_coalesced"


def _issue(a: table.Args):
    import torch.distributed as dist

    with warnings.catch_warnings():  # torch deprecates it; the call is still c10d's entry point
        warnings.simplefilter("ignore")
        return dist.all_reduce_coalesced(a.inputs, op=a.op, group=a.group, async_op=a.async_op)


ENTRY = table.Collective(NAME, "all_reduce", "coalesced", table.ONE, table.IN_PLACE, True, table.ALL_TO_ALL,
                         _issue, table.TABLE["all_reduce"].oracle, table.TABLE["all_reduce"].bus_factor,
                         labels=("tensor", "tensor"))
table.TABLE.setdefault(NAME, ENTRY)
