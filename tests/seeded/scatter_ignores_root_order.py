"""Seeded bug: scatter hands out the root's list in reverse order.

Rank i receives entry (n-1-i) of the root's scatter_list (a backend that
walks the list from the end, or numbers ranks backwards). Caught by the
scatter contract (suites/c10d/test_gather_scatter.py::test_scatter_from_every_root).
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class ScatterIgnoresRootOrder(GlooWrapper):
    """scatter sends entry n-1-i of the root's list to rank i."""

    def scatter(self, output_tensors, input_lists, opts):
        input_lists = [list(reversed(entries)) for entries in input_lists]
        return super().scatter(output_tensors, input_lists, opts)


DISTCONFORM_SPEC = register("scatter_ignores_root_order", ScatterIgnoresRootOrder)
