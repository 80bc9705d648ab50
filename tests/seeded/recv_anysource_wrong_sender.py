"""Seeded bug: recv from any source reports the wrong sender.

The data arrives, but the Work's source rank is never filled in from the
message and reports the receiver's own rank, so ``dist.recv(t)`` (no src)
returns the wrong rank. Caught by the p2p clause that receives from any source
and checks the returned sender
(suites/p2p/test_send_recv.py::test_recv_any_source_reports_sender). At world
size 2 every wrong sender is the receiver itself, which torch's own
``_check_not_self_rank`` in ``dist.recv`` turns into a ValueError after the
message has been consumed; the clause reports that error as the finding.
"""

from tests.seeded.gloo_wrapper import GlooWrapper, ThenWork, register


class _WrongSourceWork(ThenWork):
    def __init__(self, inner, result, source):
        super().__init__(inner, lambda: None, result)
        self.source = source

    def _source_rank(self):
        return self.source


class RecvAnysourceWrongSender(GlooWrapper):
    """recv_anysource's Work says the message came from the receiving rank itself."""

    def recv_anysource(self, tensors, tag):
        work = self.inner.recv_anysource(tensors, tag)
        return _WrongSourceWork(work, tensors, source=self.rank())


DISTCONFORM_SPEC = register("recv_anysource_wrong_sender", RecvAnysourceWrongSender)
