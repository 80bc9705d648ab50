"""Graceful shutdown's ledger: what each worker sent on every link and received from it.

A worker shuts down gracefully (torch's ``_wait_all_workers`` then ``join``)
once no message is in flight anywhere. Each round every worker publishes its
ledger in the store; shutdown may end when, on every *open* link, the sender's
count equals the receiver's and no count moved since the previous round.

A link either end has lost (``on_peer_lost``: reset, refused, closed) is left
out: its unread messages are gone for good and their calls already failed, as
in torch, whose ``join`` counts only calls still active. Counting them made
graceful shutdown spin forever after any lost connection.

The ledger travels through the store, so decoding is strict: anything but the
exact shape raises ``LedgerError`` naming what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


class LedgerError(ValueError):
    """A ledger read from the store is not one a worker wrote."""


@dataclass(frozen=True)
class Ledger:
    sent: tuple[int, ...]  # sent[dst]: messages handed to the link to dst (sends that raised left out)
    received: tuple[int, ...]  # received[src]: messages delivered from src
    lost: frozenset[int]  # peers whose link this worker lost

    def encode(self) -> bytes:
        return json.dumps({"sent": list(self.sent), "received": list(self.received),
                           "lost": sorted(self.lost)}).encode()

    @classmethod
    def decode(cls, raw: bytes, world_size: int) -> Ledger:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LedgerError(f"shutdown ledger is not JSON: {exc}") from None
        if not isinstance(doc, dict) or set(doc) != {"sent", "received", "lost"}:
            raise LedgerError(f"shutdown ledger must be an object with keys sent, received, lost: {raw[:80]!r}")
        counts = {}
        for key in ("sent", "received"):
            value = doc[key]
            if not isinstance(value, list) or len(value) != world_size or not all(_count(v) for v in value):
                raise LedgerError(f"shutdown ledger's {key!r} must be {world_size} counts >= 0: {value!r}"[:200])
            counts[key] = tuple(value)
        lost = doc["lost"]
        if not isinstance(lost, list) or not all(_count(v) and v < world_size for v in lost):
            raise LedgerError(f"shutdown ledger's 'lost' must be ranks below {world_size}: {lost!r}"[:200])
        return cls(counts["sent"], counts["received"], frozenset(lost))


def _count(value) -> bool:
    return type(value) is int and value >= 0


def open_links(ledgers: list[Ledger]) -> dict[tuple[int, int], tuple[int, int]]:
    """(src, dst) -> (sent by src, received by dst) for every link neither end lost."""
    return {(src, dst): (ledgers[src].sent[dst], ledgers[dst].received[src])
            for src in range(len(ledgers)) for dst in range(len(ledgers))
            if dst not in ledgers[src].lost and src not in ledgers[dst].lost}


def quiet(links: dict[tuple[int, int], tuple[int, int]]) -> bool:
    """Every message sent on an open link was received."""
    return all(sent == received for sent, received in links.values())
