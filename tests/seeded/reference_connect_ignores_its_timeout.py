"""Seeded bug in the reference backend's connection code: a lazy group's first connection ignores its timeout.

The mesh's connect() waits for its peers an hour instead of until the deadline it is given: each dial, and the wait
for the higher ranks to dial in. A group made under the reference's lazy connection switch
(DISTCONFORM_REFERENCE_LAZY_INIT=1) connects at its first collective; with the fault in place before that, the
reachable ranks wait for a peer that never dials (gloo's lazy init shows the same class of bug: pytorch/gloo#520).
Caught by the clause that bounds the first collective under a fault before the first connection
(suites/faults/test_network_faults.py, --faults all).
"""

import time

from backends.reference.transport import Mesh
from tests.seeded.reference_base import register_reference, with_mesh

AN_HOUR_S = 3600.0


class ConnectUnbounded(Mesh):
    def connect(self, peers, deadline):
        return super().connect(peers, time.monotonic() + AN_HOUR_S)  # BUG: the deadline is dropped


ConnectIgnoresItsTimeout = with_mesh(ConnectUnbounded,
                                     "A lazy group's first connection waits for its peers an hour, whatever its timeout.")


DISTCONFORM_SPEC = register_reference("reference_connect_ignores_its_timeout", ConnectIgnoresItsTimeout)
