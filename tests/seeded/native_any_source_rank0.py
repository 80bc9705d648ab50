"""Seeded bug in the native backend: recv from any source reports rank 0 as the sender.

The receive path (native/p2p.cpp, planted bug ``any_source_rank0``) completes a
wildcard receive with source rank 0 whoever sent the message, so
``dist.recv(t)`` returns the wrong rank. Caught by the any-source clause
(suites/p2p/test_send_recv.py::test_recv_any_source_reports_sender).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_any_source_rank0", "any_source_rank0",
                                       "any-source receives report rank 0")
