"""Seeded bug: gather fills the root's list in reverse rank order.

A backend that walks its peers from the highest rank down and appends.
Invisible to any check that only looks at the set of gathered values.
Caught by the gather clause, which checks entry i is rank i's tensor.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register


class GatherListReversed(GlooWrapper):
    """gather reverses the root's output list once the data has landed."""

    def gather(self, output_lists, input_tensors, opts):
        work = super().gather(output_lists, input_tensors, opts)
        outputs = output_lists[0] if output_lists else []

        def reverse():
            values = [t.clone() for t in outputs]
            for out, value in zip(outputs, reversed(values)):  # BUG: rank order reversed
                out.copy_(value)

        return ThenWork(work, reverse)


DISTCONFORM_SPEC = register("gather_list_reversed", GatherListReversed)
