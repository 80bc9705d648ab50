"""A collective added by one table entry: ``--backend-plugin tests.harness_cases.extra_collective``.

Importing it adds ``reduce_scatter_base`` (torch.distributed._reduce_scatter_base,
the private entry point older FSDP calls: one flat input, one output chunk) to
suites/collectives.py's table, in the pytest process and in every rank
(plugins are imported in both). Nothing else is written for it: the
differential suite draws and checks it, the timeout clause makes it a case,
the entry-point clause calls it, the dtype clauses reduce complex tensors and
PREMUL_SUM with it, and the benchmark measures it (tests/test_collectives_table.py).

(It used to add all_reduce_coalesced; that is now the built-in all_reduce
record's coalesced form, so an entry of its own would claim the same entry point twice.)
"""

import warnings

from suites import collectives as table

NAME = "reduce_scatter_base"
ENTRY_POINT = "_reduce_scatter_base"


def _call(fn, a: table.Args):
    with warnings.catch_warnings():  # torch deprecates it; the call is still c10d's entry point
        warnings.simplefilter("ignore")
        return fn(a.outputs[0], a.inputs[0], op=a.op, group=a.group, async_op=a.async_op)


_SINGLE = table.TABLE["reduce_scatter_tensor"]
ENTRY = table.Collective(name=NAME, family="reduce_scatter", form="base", inputs=table.FLAT, outputs=table.ONE,
                         reduces=True, flow=table.ALL_TO_ALL, call=_call, oracle=_SINGLE.oracle,
                         bus_factor=_SINGLE.bus_factor, entry_points=(ENTRY_POINT,),
                         dtypes_reduced=(table.COMPLEX, table.PREMUL_SUM))
table.TABLE.setdefault(NAME, ENTRY)
