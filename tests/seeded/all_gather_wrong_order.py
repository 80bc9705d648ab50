"""Seeded bug: all_gather fills the output list in the wrong order (rotated by one).

Every rank's tensor arrives, but entry i holds rank i+1's tensor, as with a
ring all_gather that numbers the steps from the wrong neighbour. Caught by the
all_gather contract (suites/c10d/test_gather_scatter.py::test_all_gather_list):
entry i must be rank i's tensor.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register


class AllGatherWrongOrder(GlooWrapper):
    """all_gather (list form) rotates the gathered entries by one position."""

    def allgather(self, output_lists, input_tensors, opts):
        work = self.inner.allgather(output_lists, input_tensors, opts)

        def rotate():
            for outputs in output_lists:
                gathered = [t.clone() for t in outputs]
                for i, out in enumerate(outputs):
                    out.copy_(gathered[(i + 1) % len(gathered)])

        return ThenWork(work, rotate, output_lists)


DISTCONFORM_SPEC = register("all_gather_wrong_order", AllGatherWrongOrder)
