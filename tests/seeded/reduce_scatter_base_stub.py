"""Seeded bug: the older method name of reduce_scatter is a stub that does nothing.

The backend implements torch 2.13's ``reduce_scatter_single`` and leaves the
older ``_reduce_scatter_base`` (the name ProcessGroupGloo and NCCL still bind,
and the one code written against torch before 2.13 calls on a group) as a
stub returning a completed Work without reducing anything: the output keeps
whatever it held. Every ``dist.*`` name reaches the new method and is right;
only a caller of the old method name sees the bug (issue 25: out-of-tree
backends broke on one name of the pair). Caught by
suites/c10d/test_method_names.py::test_group_method_names_agree.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, completed_work, register


class ReduceScatterBaseStub(GlooWrapper):
    """reduce_scatter_single reduces; _reduce_scatter_base returns at once, output untouched."""

    def reduce_scatter_single(self, output, input, opts):
        return self.inner._reduce_scatter_base(output, input, opts)

    def _reduce_scatter_base(self, output, input, opts):
        return completed_work([output])  # BUG: the old name was never wired to the backend


DISTCONFORM_SPEC = register("reduce_scatter_base_stub", ReduceScatterBaseStub)
