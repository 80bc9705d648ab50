"""Seeded bug: send/recv ignore the tag; messages match in arrival order.

A backend with a single unlabelled channel per peer pair: tags are accepted
and dropped, so two messages in flight between the same pair are received in
the order they were sent, whatever tag each recv asked for. Caught by a p2p
clause that sends two tagged messages and receives them in the other order.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, register


class P2PTagsIgnored(GlooWrapper):
    """send and recv always use tag 0."""

    def send(self, tensors, dst, tag):
        return super().send(tensors, dst, 0)

    def recv(self, tensors, src, tag):
        return super().recv(tensors, src, 0)

    def recv_anysource(self, tensors, tag):
        return super().recv_anysource(tensors, 0)


DISTCONFORM_SPEC = register("p2p_tags_ignored", P2PTagsIgnored)
