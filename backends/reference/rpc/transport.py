"""What a reference RPC agent needs from the wire: frames to and from peers.

The agent (agent.py) knows what messages mean; a transport only moves them.
Two transports implement this interface:

* ``tp_transport.py`` (agent ``reference-tp``): one direct socket per peer,
  tensor bytes raw next to a small header, a token from the store.
* ``pg_transport.py`` (agent ``reference-pg``): every frame over the c10d
  process group under test (tagged send/recv, a listener on recv from any
  source), as PyTorch's ProcessGroupAgent did before 1.9.

``faulty.py`` wraps either one to drop or delay chosen message kinds.

A frame is (kind, msg_id, header, tensors): ``kind`` a small int from
messages.Kind, ``msg_id`` the caller's id matching a response to its request,
``header`` bytes the agent produced (a pickle with tensors taken out),
``tensors`` the CPU tensors that travel as raw bytes. A transport never
unpickles a header and never pickles a tensor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable


class Kind(IntEnum):
    """Message kinds. Request and response names are torch's (rpc/message.h), so fault
    injection takes the same names for every agent (backends/rpc_agents.FAULTABLE_KINDS).
    The agent core may append kinds; never renumber."""

    SCRIPT_CALL = 1
    PYTHON_CALL = 2
    SCRIPT_REMOTE_CALL = 3
    PYTHON_REMOTE_CALL = 4
    SCRIPT_RREF_FETCH_CALL = 5
    PYTHON_RREF_FETCH_CALL = 6
    RREF_USER_DELETE = 7
    RREF_FORK_REQUEST = 8
    RREF_CHILD_ACCEPT = 9
    # distributed autograd (autograd/messages.py): torch's names
    FORWARD_AUTOGRAD_REQ = 10
    BACKWARD_AUTOGRAD_REQ = 11
    CLEANUP_AUTOGRAD_CONTEXT_REQ = 12
    RREF_BACKWARD_REQ = 13
    SCRIPT_RET = 20
    PYTHON_RET = 21
    REMOTE_RET = 22
    SCRIPT_RREF_FETCH_RET = 23
    PYTHON_RREF_FETCH_RET = 24
    RREF_ACK = 25
    FORWARD_AUTOGRAD_RESP = 26
    EXCEPTION = 30
    SHUTDOWN = 40  # control: graceful-shutdown handshake


@dataclass
class Frame:
    kind: int
    msg_id: int
    header: bytes
    tensors: list = field(default_factory=list)


# deliver(src_rank, frame): called from a transport thread for every frame
# that arrives. It must return quickly (the agent hands real work to its pool).
Deliver = Callable[[int, Frame], None]
# on_peer_lost(peer_rank, reason): the connection to a peer broke; the agent
# fails that peer's outstanding futures with the reason.
PeerLost = Callable[[int, str], None]


class TransportError(RuntimeError):
    """A frame could not be sent; the message names the peer and why."""


class Transport(ABC):
    name = "abstract"

    @abstractmethod
    def start(self, rank: int, world_size: int, store, deliver: Deliver, on_peer_lost: PeerLost) -> None:
        """Connect to (or get ready to reach) every peer; return when frames can flow.

        ``store`` is a c10d Store private to this agent instance (every rank
        got the same one); use it for addresses and tokens, never fixed ports.
        """

    @abstractmethod
    def send(self, dst: int, frame: Frame) -> None:
        """Send one frame to ``dst`` (never self: the agent short-circuits those).

        Thread-safe; frames to one peer arrive in the order send() returned.
        Raises TransportError naming the peer if it cannot be reached.
        """

    @abstractmethod
    def shutdown(self, within_s: float | None = None) -> None:
        """Stop threads, close connections. Idempotent. No deliver() after it returns.

        ``within_s``: what is left of a graceful shutdown's timeout, which bounds every wait for the peers here too
        (None: the transport's own bound)."""
